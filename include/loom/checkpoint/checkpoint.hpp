#pragma once
// Checkpoints that survive a crash and resume bit for bit (docs/checkpoints.md): the parameters this
// rank holds, the optimizer's state and options, every rank's random generator, the step, the
// caller's own small state (JSON, such as a data cursor) and a manifest of the plan, the schedule's
// fingerprint, the world size and the versions.
//
// Saving is collective and atomic: every rank writes and flushes its file into step-N.tmp/, the
// ranks agree, and rank 0 writes the manifest last, renames the folder to step-N/ and flushes the
// parent. A crash at any point leaves the previous checkpoint loadable; an interrupted save's
// leftovers are removed when the next run starts. Under a sharding strategy each rank writes its
// own shards; under a replicating one rank 0 writes the one copy.

#include <loom/runtime/runtime.hpp>
#include <loom/runtime/tensors.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>

namespace torch::optim {
class Optimizer;
}

namespace loom {

// A checkpoint that cannot be used: names it, the file and the difference.
class checkpoint_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct checkpoint_options {
  std::filesystem::path folder;
  int keep = 2;  // the newest complete checkpoints that stay; older ones are removed after a save
};

// Where a resumed run continues.
struct resume_point {
  std::int64_t step = 0;
  std::string user_state;  // the JSON given to save()
  std::filesystem::path path;
};

// What the checkpoint layer needs of a job; checkpointer's templates make it from one.
struct checkpoint_target {
  const runtime* rt = nullptr;
  std::string plan;  // job.describe()
  std::uint64_t schedule_fingerprint = 0;
  bool sharded = false;
  std::function<tensor_state()> state;  // what this rank saves: its shards, or the whole
  std::function<void(const tensor_state&)> load;
};

class checkpointer {
 public:
  // Every rank makes one with the same options (a collective): the folder is created if needed,
  // and rank 0 removes the leftovers of an interrupted save.
  checkpointer(const runtime& rt, checkpoint_options options);

  // Every rank calls it, after the optimizer's step `step`.
  template <class Job>
  void save(Job& job, torch::optim::Optimizer& optimizer, std::int64_t step, const std::string& user_state = "{}") {
    save(target_of(job), optimizer, step, user_state);
  }

  // Loads the newest complete checkpoint into `job` and `optimizer`, or returns nothing when there
  // is none. Every rank calls it; they agree on what they loaded before returning.
  template <class Job>
  std::optional<resume_point> resume(Job& job, torch::optim::Optimizer& optimizer) {
    return resume(target_of(job), optimizer);
  }

  // The newest complete checkpoint's folder, if any.
  [[nodiscard]] std::optional<std::filesystem::path> latest() const;

 private:
  template <class Job>
  static checkpoint_target target_of(Job& job) {
    checkpoint_target target;
    target.rt = &job.rt();
    target.plan = job.describe();
    target.schedule_fingerprint = job.schedule().fingerprint();
    target.sharded = Job::shards_state();
    target.state = [&job] { return Job::shards_state() ? job.local_state_dict() : job.state_dict(); };
    target.load = [&job](const tensor_state& state) {
      if constexpr (Job::shards_state()) {
        job.load_local_state_dict(state);
      } else {
        job.load_state_dict(state);
      }
    };
    return target;
  }

  void save(const checkpoint_target& target, torch::optim::Optimizer& optimizer, std::int64_t step,
            const std::string& user_state);
  std::optional<resume_point> resume(const checkpoint_target& target, torch::optim::Optimizer& optimizer);

  runtime rt_;
  checkpoint_options options_;
};

}  // namespace loom

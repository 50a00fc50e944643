#pragma once
// Checkpoints that survive a crash and resume bit for bit (docs/checkpoints.md): the parameters this
// rank holds, the optimizer's state and options, every rank's random generator, the step, the
// caller's own small state (JSON, such as a data cursor) and a manifest of the plan, the schedule's
// fingerprint, the world size, the versions and every file's size and checksum.
//
// Saving is collective and atomic: every rank writes and flushes its file into step-N.tmp/, the
// ranks agree, and rank 0 writes the manifest last, renames the folder to step-N/ and flushes the
// parent. A crash at any point leaves the previous checkpoint loadable; an interrupted save's
// leftovers are removed when the next run starts. An asynchronous save copies the state to host
// memory at the step and writes the files on a background thread while training goes on. Under a
// sharding strategy each rank writes its own shards; under a replicating one rank 0 writes the one
// copy. A sharded checkpoint resumes over another number of ranks too: each rank takes its rows of
// every old rank's shards, for the parameters and for the optimizer's per-element state.
//
// Resuming checks every file a rank reads against the checksum the manifest records (XXH3-64,
// loom/io/checksum.hpp) and the manifest against its own: a damaged or replaced newest checkpoint
// is set aside and the run falls back to the one before it, every rank agreeing which.

#include <loom/checkpoint/manifest.hpp>
#include <loom/checkpoint/staging.hpp>
#include <loom/io/checksum.hpp>
#include <loom/io/weights.hpp>
#include <loom/runtime/runtime.hpp>
#include <loom/runtime/tensors.hpp>

#include <ATen/core/Tensor.h>

#include <concepts>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

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
  // false: the trainable parameters and the buffers, the frozen ones being rebuilt by the plan (a
  // pretrained base under LoRA); true: every parameter.
  bool all_parameters = false;
  // A newest checkpoint that fails its checksums (damaged on disk, a file replaced): false sets it
  // aside (step-N.damaged/) and resumes from the newest one before it that passes, saying so; true
  // stops the run before any step.
  bool strict = false;
  // false: save() returns once the checkpoint is complete. true: save() copies the state to host
  // memory (pinned under CUDA) and returns; background threads write and flush the files, then
  // rank 0's manifest and rename, while training goes on, and poll() after each step sees each part
  // done (DCP's async_save). At most one save is in flight: the next save() waits for it.
  bool async_save = false;
  // What the run reads (loom::data::text_dataset::identity(); empty: none given). Recorded in every
  // checkpoint with the digest of pretrained(...)'s weights; a resume onto other data or other weights
  // of the same shapes is refused, naming both.
  std::string data{};
  // Resumes such a checkpoint anyway, saying so, rather than refusing it.
  bool resume_over_changes = false;
};

// Where a resumed run continues.
struct resume_point {
  std::int64_t step = 0;
  std::string user_state;  // the JSON given to save()
  std::filesystem::path path;
  // This rank's own state given to save() (a data position); empty when the save gave none, or when
  // the checkpoint was saved by another number of ranks (world_size) or another tensor_parallel, whose
  // states are not this rank's.
  std::string rank_state;
  int world_size = 0;       // of the run that saved it
  int tensor_parallel = 1;  // of the run that saved it
};

// What the checkpoint layer needs of a job; checkpointer's templates make it from one.
struct checkpoint_target {
  const runtime* rt = nullptr;
  std::string plan;      // job.plan_state(): compared on resume
  std::string describe;  // job.describe(): recorded in the manifest
  std::uint64_t schedule_fingerprint = 0;
  std::string schedule;                 // job.built_schedule(), one line a collective
  bool sharded = false;                 // job.holds_own_state(): every rank saves its own state
  bool strategy_shards = false;         // job.shards_state(): the strategy shards each parameter's rows
  int shard_group_size = 0;             // job.shard_group_size()
  int tensor_parallel = 1;              // job.tensor_parallel_size()
  std::function<tensor_state()> state;  // what this rank saves: its shards, or the whole
  std::function<void(const tensor_state&)> load;
  // For a checkpoint saved in another layout: each tensor as it is whole, and this rank's part of a
  // tensor from its whole values (job.whole_layouts(), job.local_part()).
  std::function<std::map<std::string, tensor_layout>()> whole_layouts;
  std::function<at::Tensor(const std::string& name, const at::Tensor& whole)> local_part;
  // The names of the optimizer's parameters.
  std::vector<std::string> optimizer_names;
  std::vector<std::string> frozen_names;          // the parameters that do not train
  std::optional<weights_fingerprint> pretrained;  // job.pretrained_fingerprint(): recorded and compared
  // A moving average of the trainable parameters kept beside them (loom/train/ema.hpp), laid out as
  // they are on this rank; both empty when the run keeps none.
  std::function<tensor_state()> averages;
  std::function<void(const tensor_state&)> load_averages;
};

// What a checkpointer saves of a moving average of the weights (loom::ema).
template <class Averages>
concept saved_averages = requires(Averages& averages, const tensor_state& state) {
  { averages.state() } -> std::same_as<tensor_state>;
  averages.load(state);
};

class checkpointer {
 public:
  // Every rank makes one with the same options (a collective): the folder is created if needed,
  // and rank 0 removes the leftovers of an interrupted save.
  checkpointer(const runtime& rt, checkpoint_options options);
  // Waits for a background write still running; a save it did not complete stays step-N.tmp/, which
  // the next checkpointer removes.
  ~checkpointer();
  checkpointer(const checkpointer&) = delete;
  checkpointer& operator=(const checkpointer&) = delete;

  // Every rank calls it, after the optimizer's step `step`. Asynchronous: returns once the state is
  // copied, after completing the save still in flight, if any. `user_state` (JSON, rank 0's) goes into
  // the manifest; `rank_state` (any text, each rank's own: its data position) into this rank's file.
  template <class Job>
  void save(Job& job, torch::optim::Optimizer& optimizer, std::int64_t step, const std::string& user_state = "{}",
            const std::string& rank_state = {}) {
    save(target_of(job), optimizer, step, user_state, rank_state);
  }

  // Loads the newest complete checkpoint into `job` and `optimizer`, or returns nothing when there
  // is none. Every rank calls it; they agree on what they loaded before returning.
  template <class Job>
  std::optional<resume_point> resume(Job& job, torch::optim::Optimizer& optimizer) {
    return resume(target_of(job), optimizer);
  }

  // The same, with a moving average of the weights (loom::ema) saved beside them and resumed, this
  // rank's part of it as of the weights. A checkpoint saved without one is refused by the resume.
  template <class Job, saved_averages Averages>
  void save(Job& job, torch::optim::Optimizer& optimizer, Averages& averages, std::int64_t step,
            const std::string& user_state = "{}", const std::string& rank_state = {}) {
    save(with_averages(target_of(job), averages), optimizer, step, user_state, rank_state);
  }
  template <class Job, saved_averages Averages>
  std::optional<resume_point> resume(Job& job, torch::optim::Optimizer& optimizer, Averages& averages) {
    return resume(with_averages(target_of(job), averages), optimizer);
  }

  // Every rank calls it at each step boundary while an asynchronous save may be in flight
  // (loom::train does): one small all-reduce then, none otherwise. Once every rank's file is
  // written it starts rank 0's manifest and rename, and once those are done the checkpoint is
  // complete; when a rank's part failed, throws on every rank, naming the file, and the previous
  // checkpoint stays the newest complete one.
  void poll();
  // Every rank calls it: blocks until the save in flight, if any, is complete, or throws as poll().
  void wait();
  [[nodiscard]] bool saving() const noexcept { return in_flight_ != nullptr; }
  // Where saves stage this rank's state on the host, kept from one save to the next (host_staging).
  [[nodiscard]] std::vector<const void*> staging_addresses() const { return staging_.addresses(); }

  // The newest complete checkpoint's folder, if any.
  [[nodiscard]] std::optional<std::filesystem::path> latest() const;

 private:
  template <class Job>
  static checkpoint_target target_of(Job& job) {
    checkpoint_target target;
    target.rt = &job.rt();
    target.plan = job.plan_state();
    target.describe = job.describe();
    target.schedule_fingerprint = job.built_schedule_fingerprint();
    target.schedule = job.built_schedule().entry_lines();
    target.sharded = job.holds_own_state();
    target.tensor_parallel = job.tensor_parallel_size();
    target.shard_group_size = job.shard_group_size();
    target.state = [&job] { return job.holds_own_state() ? job.local_state_dict() : job.state_dict(); };
    target.load = [&job](const tensor_state& state) {
      if (job.holds_own_state()) {
        job.load_local_state_dict(state);
      } else {
        job.load_state_dict(state);
      }
    };
    target.strategy_shards = job.shards_state();
    target.whole_layouts = [&job] { return job.whole_layouts(); };
    target.local_part = [&job](const std::string& name, const at::Tensor& whole) {
      return job.local_part(name, whole);
    };
    target.optimizer_names = job.trainable_names();
    target.frozen_names = job.frozen_names();
    target.pretrained = job.pretrained_fingerprint();
    return target;
  }

  template <saved_averages Averages>
  static checkpoint_target with_averages(checkpoint_target target, Averages& averages) {
    target.averages = [&averages] { return averages.state(); };
    target.load_averages = [&averages](const tensor_state& state) { averages.load(state); };
    return target;
  }

  void save(const checkpoint_target& target, torch::optim::Optimizer& optimizer, std::int64_t step,
            const std::string& user_state, const std::string& rank_state);
  std::optional<resume_point> resume(const checkpoint_target& target, torch::optim::Optimizer& optimizer);
  struct read_files;
  // Checks the checkpoint at `path` against the job and reads the files this rank needs, each
  // checked against its checksum; throws checkpoint_error, a damaged one of its own kind.
  [[nodiscard]] read_files read(const std::filesystem::path& path, const checkpoint_target& target) const;
  // Loads what read() returned, resharding when it was saved in another layout.
  resume_point load(const read_files& files, const checkpoint_target& target, torch::optim::Optimizer& optimizer) const;
  // Gathers every rank's digest of its file; rank 0 writes the manifest and renames the folder.
  void complete(const std::filesystem::path& partial, const std::filesystem::path& final_path,
                checkpoint_manifest manifest, const file_digest& mine);
  // What a checkpoint of `target` records that it was trained over.
  [[nodiscard]] trained_over trained(const checkpoint_target& target) const;
  // Whether the checkpoint at `path` may resume into `target`: nothing when it was trained over the
  // same weights and data, a checkpoint_error naming both when not, or a note for rank 0 to print
  // (resumed over changes, or a checkpoint saved before loom recorded them).
  [[nodiscard]] std::optional<std::string> check_trained_over(const std::filesystem::path& path,
                                                              const checkpoint_manifest& manifest,
                                                              const checkpoint_target& target) const;
  // The complete checkpoints in the folder, newest first.
  [[nodiscard]] std::vector<std::filesystem::path> complete_checkpoints() const;
  // The job's current state with what the checkpoint saved put over it: the frozen parameters a
  // checkpoint of the trainable ones left out stay as the plan built them.
  static tensor_state with_current(const checkpoint_target& target, const tensor_state& saved);

  runtime rt_;
  checkpoint_options options_;
  host_staging staging_;
  struct save_in_flight;
  std::unique_ptr<save_in_flight> in_flight_;
};

}  // namespace loom

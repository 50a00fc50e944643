// progress-cost: what the hang check's bookkeeping costs the training thread (docs/reliability.md).
// Each of loom's collectives is labelled ("all_gather Float[6352]") and its wait marked in the
// rank's job_progress; each communicating part of a pass is entered and left. This times both side
// by side with the same collectives untracked, over a backend whose collectives do nothing and are
// done at once, so what remains is loom's own path and the difference is the tracking alone.
//
//   build/bench/progress-cost --repetitions 7 --collectives 20000

#include "statistics.hpp"

#include <common/command_line.hpp>
#include <loom/runtime/collectives.hpp>
#include <loom/runtime/progress.hpp>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

// c10d's FakeProcessGroup needs Python's headers; this is its all-gather alone. Its work reports
// itself incomplete, as a real one does when the wait begins, so the wait is marked, and complete
// once waited, as Gloo's does, so the rank's progress lets it go at the next issue.
class no_op_backend final : public c10d::Backend {
 public:
  no_op_backend() : c10d::Backend(/*rank=*/0, /*size=*/2) {}
  const std::string getBackendName() const override { return "no-op"; }
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor&, at::Tensor&, const c10d::AllgatherOptions&) override {
    return c10::make_intrusive<done_work>();
  }

 private:
  struct done_work final : c10d::Work {
    bool wait(std::chrono::milliseconds) override {
      finish();
      return true;
    }
  };
};

struct options {
  int repetitions = 7;
  int collectives = 20000;
};

// Nanoseconds per collective: an all-gather of a unit's shard, as fsdp() issues, and its wait.
double time_collectives(loom::collectives& comm, int count) {
  const auto shard = at::ones({6352});
  auto flat = at::empty({2 * 6352});
  const auto start = clock_type::now();
  for (int i = 0; i < count; ++i) comm.all_gather(shard, flat).wait();
  return std::chrono::duration<double, std::nano>(clock_type::now() - start).count() / count;
}

// Nanoseconds per communicating part of a pass: entered and left, as job.forward and job.backward do.
double time_parts(loom::job_progress& progress, int count) {
  const auto start = clock_type::now();
  for (int i = 0; i < count; ++i) {
    progress.enter(loom::pass_part::forward, true, "schedule entries #0-#4");
    progress.leave_part();
  }
  return std::chrono::duration<double, std::nano>(clock_type::now() - start).count() / count;
}

}  // namespace

int main(int argc, char** argv) {
  options opts;
  CLI::App app("the hang check's bookkeeping on the training thread, in ns", "progress-cost");
  app.add_option("--repetitions", opts.repetitions, "alternating runs of each kind")->check(CLI::PositiveNumber);
  app.add_option("--collectives", opts.collectives, "collectives (and parts) per run")->check(CLI::PositiveNumber);
  if (const auto exit_code = recipes::parse_command_line(app, argc, argv)) return *exit_code;

  const auto backend = c10::make_intrusive<no_op_backend>();
  loom::job_progress progress;
  loom::collectives untracked(backend, 0, 2);
  loom::collectives tracked(backend, 0, 2, /*stage_through_host=*/false, &progress);
  (void)time_collectives(untracked, opts.collectives / 10);  // warm the allocator and the caches
  (void)time_collectives(tracked, opts.collectives / 10);

  std::vector<double> plain, marked, ratio, parts;
  for (int r = 0; r < opts.repetitions; ++r) {
    plain.push_back(time_collectives(untracked, opts.collectives));
    marked.push_back(time_collectives(tracked, opts.collectives));
    ratio.push_back(marked.back() / plain.back());
    parts.push_back(time_parts(progress, opts.collectives));
  }
  fmt::print("collective untracked: {:.0f} ns (median of {})\n", bench::median(plain), opts.repetitions);
  fmt::print("collective tracked:   {:.0f} ns; tracking adds {:.0f} ns, ratio {:.3f} (paired {})\n",
             bench::median(marked), bench::median(marked) - bench::median(plain),
             bench::median(marked) / bench::median(plain), bench::spread(ratio));
  fmt::print("part entered and left: {:.0f} ns\n", bench::median(parts));
  return 0;
}

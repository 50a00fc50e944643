// A rank that never issues a collective its peers wait on (tests/dist/skipped_collective.py). Usage,
// under loom-run:
//   dist-skipped-collective {host-waits|device-waits} COLLECTIVES COMPUTE_S
// Each rank issues COLLECTIVES all-reduces over the world, then computes (sleeps) for COMPUTE_S. With
// host-waits each is waited on as it is issued, as on Gloo, where the host blocks in the wait; with
// device-waits none is waited on until the computing is done, as under NCCL, whose wait() returns at
// once and leaves the device to wait: the host then waits on nothing while a collective is
// unfinished. The failpoint collective.issue (LOOM_FAILPOINT_SKIP=1) makes one rank skip one of them.
#include <loom/runtime/collectives.hpp>
#include <loom/runtime/failures.hpp>
#include <loom/runtime/runtime.hpp>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <exception>
#include <string_view>
#include <thread>
#include <vector>

namespace {

void run(const loom::runtime& rt, bool host_waits, int count, double compute_s) {
  std::vector<at::Tensor> tensors;
  std::vector<loom::pending_collective> pending;
  for (int i = 0; i < count; ++i) {
    tensors.push_back(at::full({4}, static_cast<float>(rt.rank() + i)));
    pending.push_back(rt.comm().all_reduce(tensors.back()));
    if (host_waits) pending.back().wait();
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(compute_s));
  for (loom::pending_collective& collective : pending) collective.wait();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string_view mode = argc == 4 ? argv[1] : "";
  if (mode != "host-waits" && mode != "device-waits") {
    fmt::print(stderr, "usage: dist-skipped-collective {{host-waits|device-waits}} COLLECTIVES COMPUTE_S\n");
    return 2;
  }
  try {
    const loom::runtime rt = loom::runtime::from_env();
    try {
      run(rt, mode == "host-waits", std::atoi(argv[2]), std::atof(argv[3]));
    } catch (...) {
      loom::rethrow_as_job_failure(rt, std::current_exception(), "collectives");
    }
  } catch (const std::exception& error) {
    fmt::print(stderr, "dist-skipped-collective: {}\n", error.what());
    return 1;
  }
  return 0;
}

#pragma once
// The process's place in a job and its process group: rendezvous through c10d's TCPStore, then
// Gloo for CPU tensors or NCCL for CUDA tensors.

#include <loom/runtime/collectives.hpp>
#include <loom/runtime/launch_env.hpp>
#include <loom/runtime/progress.hpp>

#include <c10/core/Device.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace c10d {
class ProcessGroup;
class Store;
}  // namespace c10d

namespace loom {

class job_failures;

class runtime {
 public:
  // Reads the launcher's variables (see launch_env) and joins the job; a single process when
  // none is set. Throws launch_error with the variable, the master or the backend at fault.
  [[nodiscard]] static runtime from_env();
  // One process on the CPU, whatever the environment says (tests, tools).
  [[nodiscard]] static runtime single_process();
  explicit runtime(const launch_env& env);

  [[nodiscard]] int rank() const noexcept;
  [[nodiscard]] int local_rank() const noexcept;
  [[nodiscard]] int world_size() const noexcept;
  // In a process group: more than one rank, or one launched rank that named its backend.
  [[nodiscard]] bool is_distributed() const noexcept;
  [[nodiscard]] backend_kind backend() const noexcept;
  [[nodiscard]] c10::Device device() const noexcept;
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept;
  [[nodiscard]] const launch_env& env() const noexcept;

  [[nodiscard]] collectives& comm() const noexcept;
  // Collectives over host (CPU) tensors, through Gloo: what the ranks agree on without a read of the
  // device (whether to stop, whether a background save is done). comm() itself unless it is NCCL's.
  [[nodiscard]] collectives& host_comm() const noexcept;
  // Where this rank is in its job, which the heartbeat publishes for the hang check: a job marks
  // its passes, the collectives their waits.
  [[nodiscard]] job_progress& progress() const noexcept;
  // This rank's part in the job's failures: publishing its own, reading a peer's
  // (loom/runtime/failures.hpp).
  [[nodiscard]] job_failures& failures() const noexcept;
  // The world group, for c10d components such as the Reducer; null for a single process.
  [[nodiscard]] const c10::intrusive_ptr<c10d::ProcessGroup>& process_group() const noexcept;
  [[nodiscard]] const c10::intrusive_ptr<c10d::Store>& store() const noexcept;

  // The other ranks whose heartbeat stopped during `window` without their leaving on purpose: they
  // died or are stopped (loom/runtime/heartbeat.hpp). Blocks for `window`; throws when the
  // rendezvous store is unreachable.
  [[nodiscard]] std::vector<int> silent_ranks(std::chrono::milliseconds window) const;
  // The other ranks that left the job on purpose (their program ended), with where they were.
  [[nodiscard]] std::vector<std::pair<int, job_position>> departed_ranks() const;

  // A runtime over `members` of the world (world ranks, ascending, this rank among them), named
  // `name`, for what runs among them alone (a strategy over the data-parallel ranks under
  // tensor_parallel): its rank, world size, process group and collectives are the group's; its
  // progress, failures and heartbeat the world's. Every rank of the world calls it at once, each for
  // its own group.
  [[nodiscard]] runtime among(const std::string& name, std::vector<int> members) const;

 private:
  struct state;
  explicit runtime(std::shared_ptr<state> made);
  std::shared_ptr<state> state_;  // shared: a runtime is a cheap handle, copies join one group
};

}  // namespace loom

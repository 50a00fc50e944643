#pragma once
// Each rank's sign of life and place in the job, to tell a peer that died or stopped (SIGKILL, a
// segfault, the OOM killer, SIGSTOP) from one that is only blocked in a collective, and to find
// waits that can never end: a thread publishes this rank's beat count and progress
// (loom/runtime/progress.hpp) in the rendezvous store every beat, on a store connection of its own,
// so a rank waiting on a collective still beats. While this rank waits, or has a collective
// unfinished on the device, the same thread runs the hang check (loom/runtime/hang_check.hpp). A
// rank that ends on purpose says so, and where, so its silence is not taken for a death; one whose
// job failed does not, so it is not taken for the cause.

#include <loom/runtime/failures.hpp>
#include <loom/runtime/launch_env.hpp>
#include <loom/runtime/progress.hpp>

#include <c10/core/Device.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace c10d {
class Store;
}

namespace loom {

struct peer_record;

class heartbeat {
 public:
  static constexpr std::chrono::milliseconds interval{500};
  // Five beats: a live rank, however busy, beats in that time.
  static constexpr std::chrono::milliseconds silence = 5 * interval;
  // How long before the transport's timeout (LOOM_TIMEOUT_S) a peer that has not issued an unfinished
  // collective is named: a look, a second one a beat later, then the publishing and a beat's linger
  // (failures.hpp), all before the transport ends the wait in words of its own.
  static constexpr std::chrono::milliseconds timeout_lead = 5 * interval;

  // Starts beating for env.rank on a clone of `store` (which must already hold the job's key space),
  // publishing `tracker`'s snapshots and telling `failures` what it reads of the job's failure;
  // checks for hangs once a wait has lasted env.hang_check (zero: never), and stops the job through
  // `failures` when a wait can never end. `device`: the rank's, on which this thread asks whether
  // collectives are complete.
  heartbeat(const c10::intrusive_ptr<c10d::Store>& store, const launch_env& env, c10::Device device,
            const job_progress& tracker, job_failures& failures);
  // Stops beating and, unless this rank's job failed, says that it left on purpose.
  ~heartbeat();
  heartbeat(const heartbeat&) = delete;
  heartbeat& operator=(const heartbeat&) = delete;

  // The ranks other than this one whose beat did not advance during `window` and that did not
  // leave on purpose: they died or are stopped. Blocks for `window`; throws when the store cannot
  // be reached.
  [[nodiscard]] std::vector<int> silent_ranks(std::chrono::milliseconds window) const;
  // The ranks other than this one that left the job on purpose, with where they were; throws when
  // the store cannot be reached.
  [[nodiscard]] std::vector<std::pair<int, job_position>> departed_ranks() const;

 private:
  void beat_until_stopped();
  [[nodiscard]] std::vector<peer_record> read_peers(c10d::Store& store) const;

  c10::intrusive_ptr<c10d::Store> store_;  // this thread's own connection
  int rank_;
  int world_size_;
  c10::Device device_;
  const job_progress& progress_;
  job_failures& failures_;
  std::chrono::milliseconds hang_check_;
  bool rank0_hosts_store_;             // else the launcher's agent does
  std::chrono::milliseconds overdue_;  // see hang_watch
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace loom

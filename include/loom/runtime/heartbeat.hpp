#pragma once
// Each rank's sign of life, to tell a peer that died or stopped (SIGKILL, a segfault, the OOM
// killer, SIGSTOP) from one that is only blocked in a collective: a thread bumps this rank's counter
// in the rendezvous store every beat, on a store connection of its own, so a rank waiting on a
// collective still beats. A rank that ends on purpose says so, so its silence is not taken for a
// death.

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace c10d {
class Store;
}

namespace loom {

class heartbeat {
 public:
  static constexpr std::chrono::milliseconds interval{500};

  // Starts beating for `rank` on a clone of `store` (which must already hold the job's key space).
  heartbeat(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size);
  // Stops beating and says that this rank left on purpose.
  ~heartbeat();
  heartbeat(const heartbeat&) = delete;
  heartbeat& operator=(const heartbeat&) = delete;

  // The ranks other than this one whose beat did not advance during `window` and that did not
  // leave on purpose: they died or are stopped. Blocks for `window`; throws when the store cannot
  // be reached.
  [[nodiscard]] std::vector<int> silent_ranks(std::chrono::milliseconds window) const;

 private:
  void beat_until_stopped();

  c10::intrusive_ptr<c10d::Store> store_;  // this thread's own connection
  int rank_;
  int world_size_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace loom

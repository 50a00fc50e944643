#pragma once
// One failure, one error on every rank. A rank that fails publishes why in the rendezvous store
// before it throws, and a rank whose collective then breaks reports that reason rather than the
// transport's "connection closed". A transport that breaks with nothing published means a peer
// died or stopped without a word (SIGKILL, a segfault, the OOM killer): the ranks that still answer
// take a roll call in the store and name the ranks that did not.

#include <c10/util/intrusive_ptr.h>

#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace c10d {
class Backend;
class Store;
}  // namespace c10d

namespace loom {

class runtime;
class job_progress;

// loom's error for a failure of the job, thrown on every rank whichever rank it began on.
class job_failure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An exception's message without the C++ backtrace that c10::Error's what() carries; a transport's
// without Gloo's source location and its generic advice.
[[nodiscard]] std::string error_text(const std::exception& error);

// This rank's part in the job's failures, and the one owner of them: whether its job has failed,
// its failure published in the rendezvous store for the other ranks (the first one published is the
// cause the others report), the failure its heartbeat last read there while it waited, its answer to
// a wait that can never end, and its report of an exception that nothing catches. The runtime holds
// one (rt.failures()); the heartbeat's thread takes it by reference. Messages are given without
// "loom: ", which the failure's error starts with.
class job_failures {
 public:
  // `error_file`: launch_env::error_file.
  explicit job_failures(int rank, std::string error_file = {});
  ~job_failures();
  job_failures(const job_failures&) = delete;
  job_failures& operator=(const job_failures&) = delete;

  // Once the rendezvous is up: the store failures are published in, and, while the process group
  // lives, the report of an exception nothing catches (Gloo throws so on its own threads), which
  // says where `progress` was and publishes it before the process aborts.
  void watch(c10::intrusive_ptr<c10d::Store> store, const job_progress& progress);
  // The process group is going: uncaught exceptions are reported as before.
  void stop_watching() noexcept;

  // This rank's job has failed: when it ends, it is not leaving on purpose, and its peers must not
  // take it for the cause.
  void mark_failed() noexcept { failed_.store(true, std::memory_order_relaxed); }
  [[nodiscard]] bool failed() const noexcept { return failed_.load(std::memory_order_relaxed); }

  // Marks the job failed, publishes `message` and throws job_failure("loom: " + message).
  [[noreturn]] void fail(const std::string& message);
  // Publishes `message` as this rank's failure, unless one is published already; quiet when the
  // store is gone. On the runtime's store connection, or on `store` (one of the caller's own).
  void publish(const std::string& message) const;
  void publish(c10d::Store& store, const std::string& message) const;
  // The failure a rank published ("rank R failed: ..."), or none, also when the store is gone.
  [[nodiscard]] std::optional<std::string> published() const;
  // The same on `store`; throws when the store is gone.
  [[nodiscard]] static std::optional<std::string> read(c10d::Store& store);

  // What the heartbeat read in the store while this rank waited: reported when the wait breaks
  // because rank 0, which hosts the store, is gone with it.
  void remember(std::string failure);
  [[nodiscard]] std::optional<std::string> remembered() const;

  // The heartbeat's answer to a wait that can never end (on its thread, with its connection): the
  // training thread is blocked inside the wait, so this rank publishes why, says it, and ends the
  // process, as PyTorch's NCCL watchdog does.
  // `blamed`: the rank the hang check found at fault, written with the error to the error file.
  [[noreturn]] void stop_hung_job(c10d::Store& store, const std::string& error, std::optional<int> blamed) const;
  // Says `message` and publishes it on a connection of its own, then lingers a beat so that waiting
  // peers read it before this process ends.
  void say_and_publish(const std::string& message) const noexcept;

  // The job's backends (Gloo's and NCCL's: the world's and each group's), whose connections a broken
  // transport closes: see break_connections.
  void enlist(const c10::intrusive_ptr<c10d::Backend>& backend);
  // Closes this rank's connections in every enlisted backend, hard (a reset, not a drain; NCCL's
  // communicators aborted, as its watchdog would at the timeout). A rank whose collective broke can
  // take no further part in the job, yet its process may live on for the transport's timeout (its
  // Gloo threads, and the runtime's destruction, wait on collectives that cannot finish now) or
  // longer (a program that caught the error); a peer waiting on it in another collective, or
  // another group, breaks now rather than then.
  void break_connections() noexcept;

 private:
  class terminate_report;

  int rank_;
  std::string error_file_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::atomic<bool> failed_ = false;
  mutable std::mutex remembered_mutex_;
  std::optional<std::string> remembered_;
  std::unique_ptr<terminate_report> terminate_report_;
  std::mutex backends_mutex_;
  std::vector<c10::weak_intrusive_ptr<c10d::Backend>> backends_;
};

// Rethrows `error`, which ended this rank's `during` (e.g. "backward pass"), as the job's
// error on this rank:
// - a job_failure, already published, as it is;
// - when a peer published a failure, a job_failure that names it;
// - a broken transport (Gloo's, or c10d's Dist errors), which breaks this rank's connections
//   (unless it hosts the store), with nothing published: a job_failure that names the ranks that did not answer the
//   roll call, or rank 0 when the store it hosts is gone;
// - anything else is this rank's own failure: published for the others, then rethrown unchanged.
[[noreturn]] void rethrow_as_job_failure(const runtime& rt, std::exception_ptr error, std::string_view during);

// Runs `work` (writing a file, say) on rank 0 alone, and returns on every rank once it is done. When
// it throws, every rank throws: rank 0 its own error, published, the others a job_failure naming it.
void run_on_rank_zero(const runtime& rt, std::string_view what, const std::function<void()>& work);
// The same with every rank doing its part (writing its own file, say).
void run_on_every_rank(const runtime& rt, std::string_view what, const std::function<void()>& work);

}  // namespace loom

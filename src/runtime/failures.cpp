#include <loom/base/text.hpp>
#include <loom/runtime/collectives.hpp>
#include <loom/runtime/failures.hpp>
#include <loom/runtime/hang_check.hpp>
#include <loom/runtime/heartbeat.hpp>
#include <loom/runtime/host_reads.hpp>
#include <loom/runtime/runtime.hpp>

#include "store_hold.hpp"

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gloo/common/error.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace loom {
namespace {

constexpr std::string_view failure_key = "loom/failure";

// How long a rank that publishes its failure and ends the process waits in between: a beat, in which
// its waiting peers' heartbeats read the failure. Their collectives break when it ends, and they
// report the failure even when rank 0, and the store with it, is gone by then.
constexpr std::chrono::milliseconds publish_linger = heartbeat::interval + std::chrono::milliseconds(250);

// The messages given here carry no "loom: " of their own, but an exception's text may.
std::string without_prefix(std::string text) {
  if (std::string_view(text).starts_with(message_prefix)) text.erase(0, message_prefix.size());
  return text;
}

bool is_transport_failure(const std::exception& error) {
  return dynamic_cast<const ::gloo::Exception*>(&error) != nullptr ||
         dynamic_cast<const c10::DistError*>(&error) != nullptr;
}

[[noreturn]] void throw_published(const runtime& rt, const std::string& published, std::string_view during) {
  throw_error<job_failure>("{}; then rank {}'s {} failed", published, rt.rank(), during);
}

[[noreturn]] void throw_lost_peer(const runtime& rt, const std::exception& error, std::string_view during,
                                  bool store_reachable) {
  job_failures& failures = rt.failures();
  const std::string transport = error_text(error);
  const std::string why = "(its own output, or the launcher's report, says why)";
  const auto window = std::min(heartbeat::silence, rt.timeout());
  std::vector<int> silent;
  std::vector<std::pair<int, job_position>> departed;
  if (store_reachable) {
    try {
      departed = rt.departed_ranks();
      if (departed.empty()) silent = rt.silent_ranks(window);
    } catch (const std::exception&) {
      store_reachable = false;
    }
  }
  // A peer may have been slower to say why than to break the transport.
  if (store_reachable) {
    if (auto published = failures.published()) throw_published(rt, *published, during);
  }
  // From here on this rank's finding is published, for the peers that have not found it yet.
  // A peer that left on purpose while this rank still needed it: their collectives differ.
  if (!departed.empty()) {
    const auto& [peer, at] = departed.front();
    failures.fail(
        fmt::format("rank {}'s {} failed: rank {} left the job {} (its program ended, or its runtime was "
                    "destroyed) while this rank still waited on it: {}",
                    rt.rank(), during, peer, at.to_string(), different_collectives));
  }
  if (!store_reachable) {
    if (auto published = failures.remembered()) throw_published(rt, *published, during);
    const std::string host = rt.env().agent_store ? "the launcher's agent, which hosts it," : "rank 0, which hosts it,";
    throw_error<job_failure>(
        "rank {}'s {} failed, and the rendezvous store is unreachable: {} is gone {}. "
        "The transport reported: {}",
        rt.rank(), during, host, why, transport);
  }
  if (silent.empty()) {
    failures.fail(
        fmt::format("rank {}'s {} failed, though every rank is alive (each one's heartbeat advanced): the "
                    "ranks may be waiting on different collectives (docs/schedule.md). The transport "
                    "reported: {}",
                    rt.rank(), during, transport));
  }
  const bool one = silent.size() == 1;
  failures.fail(fmt::format(
      "rank {}'s {} failed: {} {} fell silent (no heartbeat in the rendezvous store for {:g} s): {} died or "
      "{} stopped {}. The transport reported: {}",
      rt.rank(), during, one ? "rank" : "ranks", fmt::join(silent, ", "), std::chrono::duration<double>(window).count(),
      one ? "it" : "they", one ? "was" : "were", why, transport));
}

}  // namespace

namespace {

// Gloo's words without what loom says better: the source location it starts with ("[.../pair.cc:553] ")
// and the advice after the cause ("This is typically caused by a remote worker crashing. Check the
// logs ... GLHF!"), which loom's sentence gives with the rank's name.
std::string transport_words(std::string text) {
  if (text.starts_with('[')) {
    const std::size_t close = text.find("] ");
    if (close != std::string::npos && text.rfind(':', close) != std::string::npos) text.erase(0, close + 2);
  }
  if (const std::size_t advice = text.find(" This is typically caused by"); advice != std::string::npos)
    text.erase(advice);
  return text;
}

}  // namespace

std::string error_text(const std::exception& error) {
  std::string text = error.what();
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&error)) text = c10_error->what_without_backtrace();
  return is_transport_failure(error) ? transport_words(std::move(text)) : text;
}

// An exception on a thread where nothing catches it ends the process through std::terminate: Gloo
// throws so on its own threads when the ranks' collectives differ in size ("Received data size
// doesn't match expected size"). While it lives, loom's handler first says where this rank was and
// publishes it, so that every rank's error names the cause; the previous handler then aborts as
// before.
class job_failures::terminate_report {
 public:
  terminate_report(const job_failures& failures, const job_progress& progress)
      : failures_(failures), progress_(progress), outer_(active), previous_(std::set_terminate(handle)) {
    active = this;
  }
  ~terminate_report() {
    active = outer_;
    std::set_terminate(previous_);
  }
  terminate_report(const terminate_report&) = delete;
  terminate_report& operator=(const terminate_report&) = delete;

 private:
  [[noreturn]] static void handle() {
    const terminate_report* report = active;
    std::terminate_handler next = report ? report->previous_ : nullptr;
    if (report) report->report();
    if (next) next();
    std::abort();
  }

  void report() const noexcept {
    std::string what = "no exception (std::terminate was called)";
    if (const std::exception_ptr error = std::current_exception()) {
      try {
        std::rethrow_exception(error);
      } catch (const std::exception& failure) {
        what = error_text(failure);
      } catch (...) {
        what = "an exception that is not a std::exception";
      }
    }
    try {
      failures_.say_and_publish(fmt::format("an error where nothing catches it ended the process ({}): {}",
                                            progress_.snapshot().where(), what));
    } catch (...) {
      // Nothing more can be said: the process ends either way.
    }
  }

  // std::set_terminate's handler is the process's: the report installed last answers it.
  static inline terminate_report* active = nullptr;
  const job_failures& failures_;
  const job_progress& progress_;
  terminate_report* outer_;
  std::terminate_handler previous_;
};

job_failures::job_failures(int rank, std::string error_file) : rank_(rank), error_file_(std::move(error_file)) {}
job_failures::~job_failures() = default;

void job_failures::watch(c10::intrusive_ptr<c10d::Store> store, const job_progress& progress) {
  store_ = std::move(store);
  terminate_report_ = std::make_unique<terminate_report>(*this, progress);
}

void job_failures::stop_watching() noexcept { terminate_report_.reset(); }

void job_failures::fail(const std::string& message) {
  mark_failed();
  publish(message);
  throw_error<job_failure>("{}", without_prefix(message));
}

void job_failures::publish(const std::string& message) const {
  if (store_) publish(*store_, message);
}

void job_failures::publish(c10d::Store& store, const std::string& message) const {
  const std::string text = fmt::format("rank {} failed: {}", rank_, without_prefix(message));
  try {
    // The first failure published is the cause; later ones are its consequences.
    store.compareSet(std::string(failure_key), {}, std::vector<std::uint8_t>(text.begin(), text.end()));
  } catch (const std::exception&) {
    // The store is gone with rank 0: the launcher reports this rank's own error.
  }
}

std::optional<std::string> job_failures::read(c10d::Store& store) {
  const std::string key(failure_key);
  if (!store.check({key})) return std::nullopt;
  auto bytes = store.get(key);
  return std::string(bytes.begin(), bytes.end());
}

std::optional<std::string> job_failures::published() const {
  if (!store_) return std::nullopt;
  try {
    return read(*store_);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

void job_failures::remember(std::string failure) {
  const std::lock_guard lock(remembered_mutex_);
  remembered_ = std::move(failure);
}

std::optional<std::string> job_failures::remembered() const {
  const std::lock_guard lock(remembered_mutex_);
  return remembered_;
}

void job_failures::say_and_publish(const std::string& message) const noexcept {
  try {
    fmt::print(stderr, "{}\n", error_message("rank {} failed: {}", rank_, without_prefix(message)));
    std::fflush(nullptr);
    if (store_) publish(*store_->clone(), message);  // a connection of its own: the others may be in use
    std::this_thread::sleep_for(publish_linger);
  } catch (...) {
    // Nothing more can be said: the process ends either way.
  }
}

void job_failures::stop_hung_job(c10d::Store& store, const std::string& error, std::optional<int> blamed) const {
  publish(store, error);
  if (!error_file_.empty() && blamed) {
    // Written before this rank exits, so that loom-run, which reads it then, names the rank at fault.
    if (std::FILE* file = std::fopen(error_file_.c_str(), "w")) {
      fmt::print(file, "{}\n{}\n", *blamed, without_prefix(error));
      std::fclose(file);
    }
  }
  fmt::print(stderr, "{}\n", error_message("rank {} failed: {}", rank_, without_prefix(error)));
  std::fflush(nullptr);
  std::this_thread::sleep_for(publish_linger);
  std::_Exit(1);
}

void job_failures::enlist(const c10::intrusive_ptr<c10d::Backend>& backend) {
  const std::lock_guard lock(backends_mutex_);
  backends_.emplace_back(backend);
}

void job_failures::break_connections() noexcept {
  const std::lock_guard lock(backends_mutex_);
  for (const auto& enlisted : backends_) {
    try {
      if (auto backend = enlisted.lock()) backend->abort();
    } catch (const std::exception&) {
      // A connection that cannot be closed now closes with the process.
    }
  }
}

namespace {

std::string released_key(int rank) { return fmt::format("loom/released/{}", rank); }

// However the diagnosis of a failure ends, this rank has read in the store what it needed.
class release_when_done {
 public:
  explicit release_when_done(const runtime& rt) : rt_(rt) {}
  ~release_when_done() {
    if (rt_.store() && !rt_.env().hosts_store()) release_store(*rt_.store(), rt_.rank());
  }
  release_when_done(const release_when_done&) = delete;
  release_when_done& operator=(const release_when_done&) = delete;

 private:
  const runtime& rt_;
};

}  // namespace

void release_store(c10d::Store& store, int rank) noexcept {
  try {
    store.set(released_key(rank), std::vector<std::uint8_t>{1});
  } catch (const std::exception&) {
    // The store is gone already: there is nothing left to hold.
  }
}

void hold_store_for_peers(c10d::Store& store, int rank, int world_size) noexcept {
  const auto deadline = std::chrono::steady_clock::now() + store_hold_bound;
  std::vector<std::string> waiting;
  for (int peer = 0; peer < world_size; ++peer) {
    if (peer != rank) waiting.push_back(released_key(peer));
  }
  try {
    while (!waiting.empty() && std::chrono::steady_clock::now() < deadline) {
      std::erase_if(waiting, [&](const std::string& key) { return store.check({key}); });
      if (!waiting.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } catch (const std::exception&) {
    // This process serves the store; a failed check means it cannot be asked: stop waiting.
  }
}

void rethrow_as_job_failure(const runtime& rt, std::exception_ptr error, std::string_view during) {
  job_failures& failures = rt.failures();
  failures.mark_failed();
  const release_when_done release(rt);
  try {
    std::rethrow_exception(error);
  } catch (const job_failure&) {
    throw;
  } catch (const std::exception& failure) {
    // The rank that hosts the store breaks its connections as it ends (store_hold.hpp): until then
    // its peers read why in the store, and their hang check ends any wait on it.
    if (is_transport_failure(failure) && !rt.env().hosts_store()) failures.break_connections();
    if (!rt.store()) throw;
    // One look at the store: when it is gone, every further call would wait and log in vain.
    bool store_reachable = true;
    try {
      if (auto published = job_failures::read(*rt.store())) throw_published(rt, *published, during);
    } catch (const job_failure&) {
      throw;
    } catch (const std::exception&) {
      store_reachable = false;
    }
    if (is_transport_failure(failure)) throw_lost_peer(rt, failure, during, store_reachable);
    if (store_reachable) failures.publish(error_text(failure));
    throw;
  }
}

namespace {

// Runs `work` where `mine`, then tells every rank whether it failed anywhere.
void run_and_agree(const runtime& rt, std::string_view what, bool mine, const std::function<void()>& work) {
  job_failures& failures = rt.failures();
  std::exception_ptr error;
  if (mine) {
    try {
      work();
    } catch (const std::exception& failure) {
      error = std::current_exception();
      failures.publish(error_text(failure));
    }
  }
  at::Tensor failed = at::full({1}, error ? 1 : 0, at::TensorOptions().dtype(at::kInt));
  rt.host_comm().all_reduce(failed).wait();
  if (error || host_value<int>(failed) != 0) failures.mark_failed();
  if (error) std::rethrow_exception(error);
  if (host_value<int>(failed) != 0) {
    throw_error<job_failure>("{}; so {} failed on rank {} too", failures.published().value_or("another rank failed"),
                             what, rt.rank());
  }
}

}  // namespace

void run_on_rank_zero(const runtime& rt, std::string_view what, const std::function<void()>& work) {
  run_and_agree(rt, what, rt.rank() == 0, work);
}

void run_on_every_rank(const runtime& rt, std::string_view what, const std::function<void()>& work) {
  run_and_agree(rt, what, true, work);
}

}  // namespace loom

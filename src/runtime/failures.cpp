#include <loom/runtime/collectives.hpp>
#include <loom/runtime/failures.hpp>
#include <loom/runtime/hang_check.hpp>
#include <loom/runtime/heartbeat.hpp>
#include <loom/runtime/runtime.hpp>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gloo/common/error.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <vector>

namespace loom {
namespace {

constexpr std::string_view failure_key = "loom/failure";

// The failure the heartbeat last read while this rank waited (remember_published_failure).
std::mutex& remembered_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::optional<std::string>& remembered() {
  static std::optional<std::string> failure;
  return failure;
}

std::optional<std::string> remembered_failure() {
  const std::lock_guard lock(remembered_mutex());
  return remembered();
}

std::string without_prefix(std::string text) {
  constexpr std::string_view prefix = "loom: ";
  if (std::string_view(text).starts_with(prefix)) text.erase(0, prefix.size());
  return text;
}

bool is_transport_failure(const std::exception& error) {
  return dynamic_cast<const ::gloo::Exception*>(&error) != nullptr ||
         dynamic_cast<const c10::DistError*>(&error) != nullptr;
}

[[noreturn]] void throw_published(const runtime& rt, const std::string& published, std::string_view during) {
  throw job_failure(fmt::format("loom: {}; then rank {}'s {} failed", published, rt.rank(), during));
}

[[noreturn]] void throw_lost_peer(const runtime& rt, const std::exception& error, std::string_view during,
                                  bool store_reachable) {
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
    if (auto published = published_failure(rt)) throw_published(rt, *published, during);
  }
  // From here on this rank's finding is published, for the peers that have not found it yet.
  // A peer that left on purpose while this rank still needed it: their collectives differ.
  if (!departed.empty()) {
    const auto& [peer, at] = departed.front();
    fail_job(rt, fmt::format("rank {}'s {} failed: rank {} left the job {} (its program ended, or its runtime was "
                             "destroyed) while this rank still waited on it: {}",
                             rt.rank(), during, peer, at.to_string(), different_collectives));
  }
  if (!store_reachable) {
    if (auto published = remembered_failure()) throw_published(rt, *published, during);
    const std::string host = rt.env().agent_store ? "the launcher's agent, which hosts it," : "rank 0, which hosts it,";
    throw job_failure(
        fmt::format("loom: rank {}'s {} failed, and the rendezvous store is unreachable: {} is gone {}. "
                    "The transport reported: {}",
                    rt.rank(), during, host, why, transport));
  }
  if (silent.empty()) {
    fail_job(rt, fmt::format("rank {}'s {} failed, though every rank is alive (each one's heartbeat advanced): the "
                             "ranks may be waiting on different collectives (docs/schedule.md). The transport "
                             "reported: {}",
                             rt.rank(), during, transport));
  }
  const bool one = silent.size() == 1;
  fail_job(
      rt,
      fmt::format(
          "rank {}'s {} failed: {} {} fell silent (no heartbeat in the rendezvous store for {:g} s): {} died or "
          "{} stopped {}. The transport reported: {}",
          rt.rank(), during, one ? "rank" : "ranks", fmt::join(silent, ", "),
          std::chrono::duration<double>(window).count(), one ? "it" : "they", one ? "was" : "were", why, transport));
}

void publish(const runtime& rt, const std::string& message) {
  if (rt.store()) publish_failure(*rt.store(), rt.rank(), message);
}

}  // namespace

std::string error_text(const std::exception& error) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&error)) return c10_error->what_without_backtrace();
  return error.what();
}

void fail_job(const runtime& rt, const std::string& message) {
  rt.progress().mark_failed();
  publish(rt, message);
  throw job_failure("loom: " + without_prefix(message));
}

std::optional<std::string> read_published_failure(c10d::Store& store) {
  const std::string key(failure_key);
  if (!store.check({key})) return std::nullopt;
  auto bytes = store.get(key);
  return std::string(bytes.begin(), bytes.end());
}

void publish_failure(c10d::Store& store, int rank, const std::string& message) {
  const std::string text = fmt::format("rank {} failed: {}", rank, without_prefix(message));
  try {
    // The first failure published is the cause; later ones are its consequences.
    store.compareSet(std::string(failure_key), {}, std::vector<std::uint8_t>(text.begin(), text.end()));
  } catch (const std::exception&) {
    // The store is gone with rank 0: the launcher reports this rank's own error.
  }
}

void remember_published_failure(std::string failure) {
  const std::lock_guard lock(remembered_mutex());
  remembered() = std::move(failure);
}

std::optional<std::string> published_failure(const runtime& rt) {
  if (!rt.store()) return std::nullopt;
  try {
    return read_published_failure(*rt.store());
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

void rethrow_as_job_failure(const runtime& rt, std::exception_ptr error, std::string_view during) {
  rt.progress().mark_failed();
  try {
    std::rethrow_exception(error);
  } catch (const job_failure&) {
    throw;
  } catch (const std::exception& failure) {
    if (!rt.store()) throw;
    // One look at the store: when it is gone, every further call would wait and log in vain.
    bool store_reachable = true;
    try {
      if (auto published = read_published_failure(*rt.store())) throw_published(rt, *published, during);
    } catch (const job_failure&) {
      throw;
    } catch (const std::exception&) {
      store_reachable = false;
    }
    if (is_transport_failure(failure)) throw_lost_peer(rt, failure, during, store_reachable);
    if (store_reachable) publish(rt, error_text(failure));
    throw;
  }
}

namespace {

// Runs `work` where `mine`, then tells every rank whether it failed anywhere.
void run_and_agree(const runtime& rt, std::string_view what, bool mine, const std::function<void()>& work) {
  std::exception_ptr error;
  if (mine) {
    try {
      work();
    } catch (const std::exception& failure) {
      error = std::current_exception();
      publish(rt, error_text(failure));
    }
  }
  at::Tensor failed = at::full({1}, error ? 1 : 0, at::TensorOptions().dtype(at::kInt).device(rt.device()));
  rt.comm().all_reduce(failed).wait();
  if (error || failed.item<int>() != 0) rt.progress().mark_failed();
  if (error) std::rethrow_exception(error);
  if (failed.item<int>() != 0) {
    throw job_failure(fmt::format("loom: {}; so {} failed on rank {} too",
                                  published_failure(rt).value_or("another rank failed"), what, rt.rank()));
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

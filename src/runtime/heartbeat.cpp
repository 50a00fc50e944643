#include <loom/runtime/heartbeat.hpp>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <fmt/format.h>

#include <string>

namespace loom {
namespace {

std::string beat_key(int rank) { return fmt::format("loom/heartbeat/{}", rank); }
std::string left_key(int rank) { return fmt::format("loom/left/{}", rank); }

}  // namespace

heartbeat::heartbeat(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size)
    : store_(store->clone()), rank_(rank), world_size_(world_size) {
  store_->add(beat_key(rank_), 1);
  thread_ = std::thread([this] { beat_until_stopped(); });
}

heartbeat::~heartbeat() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
  try {
    store_->set(left_key(rank_), std::vector<std::uint8_t>{1});
  } catch (const std::exception&) {
    // The store left first (rank 0 hosts it): there is nobody to tell.
  }
}

void heartbeat::beat_until_stopped() {
  std::unique_lock lock(mutex_);
  while (!wake_.wait_for(lock, interval, [this] { return stopping_; })) {
    try {
      store_->add(beat_key(rank_), 1);
    } catch (const std::exception&) {
      return;  // the store is gone, and with it everyone who could listen
    }
  }
}

std::vector<int> heartbeat::silent_ranks(std::chrono::milliseconds window) const {
  // A second clone: the beating thread's connection is not for sharing across threads' waits.
  auto store = store_->clone();
  const auto beats = [&] {
    std::vector<std::int64_t> counts(static_cast<std::size_t>(world_size_));
    for (int rank = 0; rank < world_size_; ++rank)
      counts[static_cast<std::size_t>(rank)] = store->add(beat_key(rank), 0);
    return counts;
  };
  const auto before = beats();
  std::this_thread::sleep_for(window);
  const auto after = beats();
  std::vector<int> silent;
  for (int rank = 0; rank < world_size_; ++rank) {
    const auto r = static_cast<std::size_t>(rank);
    if (rank != rank_ && after[r] == before[r] && !store->check({left_key(rank)})) silent.push_back(rank);
  }
  return silent;
}

}  // namespace loom

#include <loom/runtime/failures.hpp>
#include <loom/runtime/hang_check.hpp>
#include <loom/runtime/heartbeat.hpp>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <string>

namespace loom {
namespace {

std::string progress_key(int rank) { return fmt::format("loom/progress/{}", rank); }
std::string left_key(int rank) { return fmt::format("loom/left/{}", rank); }

std::vector<std::uint8_t> bytes(const std::string& text) { return {text.begin(), text.end()}; }
std::string text(const std::vector<std::uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

// A key's value, or nothing when it is not set (get would wait for it).
std::optional<std::string> value_of(c10d::Store& store, const std::string& key) {
  if (!store.check({key})) return std::nullopt;
  return text(store.get(key));
}

// How long a collective may stay unfinished before a peer that has not issued it is named: the
// heartbeat's lead short of the transport's timeout, or half a timeout too short for that lead.
std::chrono::milliseconds overdue_after(std::chrono::milliseconds timeout) {
  return std::max(timeout - heartbeat::timeout_lead, timeout / 2);
}

}  // namespace

heartbeat::heartbeat(const c10::intrusive_ptr<c10d::Store>& store, const launch_env& env, c10::Device device,
                     const job_progress& tracker, job_failures& failures)
    : store_(store->clone()),
      rank_(env.rank),
      world_size_(env.world_size),
      device_(device),
      progress_(tracker),
      failures_(failures),
      hang_check_(env.hang_check),
      rank0_hosts_store_(!env.agent_store),
      overdue_(overdue_after(env.timeout)) {
  store_->set(progress_key(rank_), bytes(encode_progress(0, progress_.snapshot())));
  thread_ = std::thread([this] { beat_until_stopped(); });
}

heartbeat::~heartbeat() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
  if (failures_.failed()) return;  // its leaving is a consequence of the failure, not the cause
  try {
    store_->set(left_key(rank_), bytes(encode_position(progress_.snapshot().at)));
  } catch (const std::exception&) {
    // The store left first (rank 0 hosts it): there is nobody to tell.
  }
}

void heartbeat::beat_until_stopped() {
  // Each snapshot asks the device whether collectives are complete (NCCL's events): on the rank's
  // device, or CUDA would give this thread a context of its own on device 0.
  if (!device_.is_cpu()) c10::impl::getDeviceGuardImpl(device_.type())->setDevice(device_);
  hang_watch watch(rank_, hang_check_, silence, overdue_);
  std::int64_t beat = 0;
  std::optional<hang_watch::clock::time_point> store_lost_at;
  std::unique_lock lock(mutex_);
  while (!wake_.wait_for(lock, interval, [this] { return stopping_; })) {
    if (store_lost_at) {
      // Gloo does not always see a killed rank's connections close: the store's loss is the sign.
      if (watch.waits_on_lost_host(progress_.snapshot(), *store_lost_at, hang_watch::clock::now())) {
        failures_.break_connections();
        return;
      }
      continue;
    }
    try {
      const progress_snapshot mine = progress_.snapshot();
      store_->set(progress_key(rank_), bytes(encode_progress(++beat, mine)));
      if (hang_check_.count() == 0 || !mine.awaits_peers()) {
        watch.reset();
        continue;
      }
      // Read now: the wait may break when rank 0, which hosts the store, is already gone.
      const auto published = job_failures::read(*store_);
      if (published) failures_.remember(*published);
      if (!watch.due(mine)) continue;
      const auto peers = read_peers(*store_);
      if (auto error = watch.look(mine, peers, published, hang_watch::clock::now()))
        failures_.stop_hung_job(*store_, *error, watch.blamed());
    } catch (const std::exception&) {
      // The store is gone, and with it everyone who could listen: where rank 0 hosted it, rank 0 too.
      if (hang_check_.count() == 0 || !rank0_hosts_store_) return;
      store_lost_at = hang_watch::clock::now();
    }
  }
}

std::vector<peer_record> heartbeat::read_peers(c10d::Store& store) const {
  std::vector<peer_record> peers;
  for (int rank = 0; rank < world_size_; ++rank) {
    if (rank == rank_) continue;
    peer_record peer{.rank = rank, .beat = {}, .progress = {}, .left_at = {}};
    if (auto record = value_of(store, progress_key(rank))) {
      if (auto decoded = decode_progress(*record)) {
        peer.beat = decoded->first;
        peer.progress = std::move(decoded->second);
      }
    }
    if (auto left = value_of(store, left_key(rank))) peer.left_at = decode_position(*left).value_or(job_position{});
    peers.push_back(std::move(peer));
  }
  return peers;
}

std::vector<int> heartbeat::silent_ranks(std::chrono::milliseconds window) const {
  // A second clone: the beating thread's connection is not for sharing across threads' waits.
  auto store = store_->clone();
  const auto before = read_peers(*store);
  std::this_thread::sleep_for(window);
  const auto after = read_peers(*store);
  std::vector<int> silent;
  for (std::size_t i = 0; i < after.size(); ++i) {
    if (after[i].beat == before[i].beat && !after[i].left_at) silent.push_back(after[i].rank);
  }
  return silent;
}

std::vector<std::pair<int, job_position>> heartbeat::departed_ranks() const {
  auto store = store_->clone();
  std::vector<std::pair<int, job_position>> departed;
  for (const peer_record& peer : read_peers(*store)) {
    if (peer.left_at) departed.emplace_back(peer.rank, *peer.left_at);
  }
  return departed;
}

}  // namespace loom

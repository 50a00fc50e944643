#include <loom/runtime/agreement.hpp>

#include <loom/runtime/host_reads.hpp>
#include <loom/runtime/runtime.hpp>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cstring>
#include <optional>
#include <vector>

namespace loom {
namespace {

struct divergence {
  std::size_t index;
  int rank;
};

// The first position where some rank's list differs from rank 0's (or has no entry), and the lowest
// such rank: the same answer on every rank. The first all-gather (the lengths) has one shape on
// every rank, and so, given it, has the second.
std::optional<divergence> first_divergence(const runtime& rt, std::span<const std::uint64_t> hashes) {
  const auto world = static_cast<std::int64_t>(rt.world_size());
  // Host tensors over host_comm(): what is compared lives on the host, and no device is read.
  const auto options = at::TensorOptions().dtype(at::kLong);
  auto length = at::full({1}, static_cast<std::int64_t>(hashes.size()), options);
  auto lengths = at::empty({world}, options);
  rt.host_comm().all_gather(length, lengths).wait();
  const std::int64_t longest = host_value<std::int64_t>(lengths.max());

  auto mine = at::zeros({longest}, options);
  std::memcpy(mine.data_ptr<std::int64_t>(), hashes.data(), hashes.size() * sizeof(std::uint64_t));
  auto all = at::empty({world * longest}, options);
  if (longest > 0) rt.host_comm().all_gather(mine, all).wait();
  const auto* table = all.data_ptr<std::int64_t>();
  const auto* length_of = lengths.data_ptr<std::int64_t>();

  for (std::int64_t i = 0; i < longest; ++i) {
    for (std::int64_t r = 1; r < world; ++r) {
      const bool both = i < length_of[0] && i < length_of[r];
      const bool neither = i >= length_of[0] && i >= length_of[r];
      if (neither || (both && table[r * longest + i] == table[i])) continue;
      return divergence{static_cast<std::size_t>(i), static_cast<int>(r)};
    }
  }
  return std::nullopt;
}

// Every rank's `mine` under `key`, through the rendezvous store. Returns once every rank has read
// them all: the caller throws next, and rank 0, which may host the store, must not end it first.
std::vector<std::string> share_text(const runtime& rt, const std::string& key, const std::string& mine) {
  const auto& store = rt.store();
  store->set(fmt::format("{}/{}", key, rt.rank()), std::vector<std::uint8_t>(mine.begin(), mine.end()));
  std::vector<std::string> texts;
  for (int r = 0; r < rt.world_size(); ++r) {
    auto bytes = store->get(fmt::format("{}/{}", key, r));
    texts.emplace_back(bytes.begin(), bytes.end());
  }
  const std::string all_read = key + "/all-read";
  if (store->add(key + "/read", 1) == rt.world_size()) store->set(all_read, std::vector<std::uint8_t>{1});
  store->wait({all_read});
  return texts;
}

}  // namespace

std::uint64_t fnv1a(const void* data, std::size_t size, std::uint64_t hash) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < size; ++i) hash = (hash ^ bytes[i]) * 1099511628211ull;
  return hash;
}

void require_agreement(const runtime& rt, std::string_view topic, std::span<const std::uint64_t> hashes,
                       const std::function<std::string(std::size_t index)>& describe,
                       const std::function<std::string(const disagreement&)>& explain) {
  if (!rt.is_distributed()) return;
  const std::uint64_t digest[] = {fnv1a(hashes.data(), hashes.size_bytes(), fnv1a(std::to_string(hashes.size())))};
  if (!first_divergence(rt, digest)) return;

  const auto where = first_divergence(rt, hashes).value_or(divergence{hashes.size(), 0});
  const std::string mine = where.index < hashes.size() ? describe(where.index) : "(none)";
  const auto texts = share_text(rt, fmt::format("loom/{}/{}", topic, where.index), mine);
  throw rank_mismatch(explain({where.index, where.rank, texts.front(), texts[static_cast<std::size_t>(where.rank)]}));
}

std::optional<rank_problem> first_problem(const runtime& rt, std::string_view topic,
                                          const std::optional<std::string>& mine) {
  if (!rt.is_distributed()) {
    if (!mine) return std::nullopt;
    return rank_problem{rt.rank(), *mine};
  }
  const auto options = at::TensorOptions().dtype(at::kInt);
  const at::Tensor found = at::full({1}, mine ? 1 : 0, options);
  at::Tensor every = at::empty({rt.world_size()}, options);
  rt.host_comm().all_gather(found, every).wait();
  const at::Tensor finders = every.nonzero();
  if (finders.numel() == 0) return std::nullopt;
  const int rank = static_cast<int>(host_value<std::int64_t>(finders[0]));

  // The key is removed by the last rank to read it, before that rank's next all-reduce here: no
  // rank can read a stale text under the same topic later.
  const auto& store = rt.store();
  const std::string key = fmt::format("loom/{}/problem", topic);
  if (rank == rt.rank()) store->set(key, std::vector<std::uint8_t>(mine->begin(), mine->end()));
  const std::vector<std::uint8_t> bytes = store->get(key);
  if (store->add(key + "/read", 1) % rt.world_size() == 0) store->deleteKey(key);
  return rank_problem{rank, std::string(bytes.begin(), bytes.end())};
}

}  // namespace loom

#include <loom/detail/consensus.hpp>

#include <loom/runtime.hpp>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstring>

namespace loom {
namespace detail {

std::uint64_t fnv1a(const void* data, std::size_t size, std::uint64_t hash) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < size; ++i) hash = (hash ^ bytes[i]) * 1099511628211ull;
  return hash;
}

std::optional<divergence> first_divergence(const runtime& rt, std::span<const std::uint64_t> hashes) {
  const auto world = static_cast<std::int64_t>(rt.world_size());
  auto options = at::TensorOptions().dtype(at::kLong).device(rt.device());
  // Lengths first, so that the second all-gather has the same shape on every rank.
  auto length = at::full({1}, static_cast<std::int64_t>(hashes.size()), options);
  auto lengths = at::empty({world}, options);
  rt.comm().all_gather(length, lengths).wait();
  auto lengths_cpu = lengths.cpu();
  const std::int64_t longest = lengths_cpu.max().item<std::int64_t>();

  auto mine = at::zeros({longest}, at::kLong);
  std::memcpy(mine.data_ptr<std::int64_t>(), hashes.data(), hashes.size() * sizeof(std::uint64_t));
  auto all = at::empty({world * longest}, options);
  if (longest > 0) rt.comm().all_gather(mine.to(rt.device()), all).wait();
  auto all_cpu = all.cpu().view({world, longest});
  auto* table = all_cpu.data_ptr<std::int64_t>();
  const auto* length_of = lengths_cpu.data_ptr<std::int64_t>();

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

std::vector<std::string> share_text(const runtime& rt, const std::string& key, const std::string& mine) {
  const auto& store = rt.store();
  store->set(fmt::format("{}/{}", key, rt.rank()), std::vector<std::uint8_t>(mine.begin(), mine.end()));
  std::vector<std::string> texts;
  for (int r = 0; r < rt.world_size(); ++r) {
    auto bytes = store->get(fmt::format("{}/{}", key, r));
    texts.emplace_back(bytes.begin(), bytes.end());
  }
  return texts;
}

}  // namespace detail

}  // namespace loom

#pragma once
// Agreement across ranks on a list of 64-bit hashes, with fixed-shape collectives only, so that
// ranks that disagree fail together instead of hanging in mismatched collectives.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace loom {
class runtime;
}

namespace loom::detail {

[[nodiscard]] std::uint64_t fnv1a(const void* data, std::size_t size, std::uint64_t hash = 14695981039346656037ull);
[[nodiscard]] inline std::uint64_t fnv1a(std::string_view text, std::uint64_t hash = 14695981039346656037ull) {
  return fnv1a(text.data(), text.size(), hash);
}

struct divergence {
  std::size_t index;  // the first position where some rank differs from rank 0 (or has no entry)
  int rank;           // the lowest such rank
};

// The same answer on every rank.
[[nodiscard]] std::optional<divergence> first_divergence(const runtime& rt, std::span<const std::uint64_t> hashes);

// Every rank's `mine` under `key`, through the rendezvous store.
[[nodiscard]] std::vector<std::string> share_text(const runtime& rt, const std::string& key, const std::string& mine);

}  // namespace loom::detail

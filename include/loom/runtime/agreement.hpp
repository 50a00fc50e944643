#pragma once
// Agreement across ranks, a runtime service: that every rank holds the same list of items (the
// schedule's entries, a replica's tensors, what a checkpoint loaded), checked with fixed-shape
// collectives only, so that ranks that disagree fail together within seconds instead of hanging in
// mismatched collectives. On a difference every rank throws rank_mismatch, naming the first item
// that differs and each side's version of it.

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

namespace loom {

class runtime;

// Thrown on every rank when the ranks disagree about what they built or loaded.
class rank_mismatch : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr std::uint64_t fnv1a_offset = 14695981039346656037ull;
[[nodiscard]] std::uint64_t fnv1a(const void* data, std::size_t size, std::uint64_t hash = fnv1a_offset);
[[nodiscard]] inline std::uint64_t fnv1a(std::string_view text, std::uint64_t hash = fnv1a_offset) {
  return fnv1a(text.data(), text.size(), hash);
}

// The first item where the ranks differ: its index, the lowest rank that differs from rank 0 there,
// and both ranks' descriptions of it ("(none)" past the end of a shorter list).
struct disagreement {
  std::size_t index;
  int rank;
  std::string rank0_item;
  std::string other_item;
};

// Checks that every rank's `hashes` equal rank 0's: two small all-gathers (the count and a digest)
// when they do. Otherwise a third, of the hashes, finds the first difference; the two ranks'
// describe(index) are exchanged through the rendezvous store under `topic`, and every rank throws
// rank_mismatch(explain(difference)). Does nothing in a single process.
void require_agreement(const runtime& rt, std::string_view topic, std::span<const std::uint64_t> hashes,
                       const std::function<std::string(std::size_t index)>& describe,
                       const std::function<std::string(const disagreement&)>& explain);

// One rank's problem with something every rank checked for itself (a file it read, say).
struct rank_problem {
  int rank;
  std::string text;
};

// The problem of the lowest rank that has one, told to every rank, or nothing when no rank has one:
// one small all-reduce, and the text through the rendezvous store under `topic` when there is one.
// Every rank calls it with its own finding; in a single process it returns this rank's.
[[nodiscard]] std::optional<rank_problem> first_problem(const runtime& rt, std::string_view topic,
                                                        const std::optional<std::string>& mine);

}  // namespace loom

#pragma once
// Packing short examples into sequences of a fixed length (docs/data.md, "Packing"), as TRL's
// pack_dataset, torchtune's PackedDataset and Axolotl's multipack do, for a model that attends
// within each example (CausalLM's forward(ids, labels, positions)): each example keeps its own
// positions from 0, and the rest of a sequence is padding that carries no loss.
//
// Two strategies: first-fit decreasing (the longest example first, each into the first sequence
// with room for it: fewer sequences, and the order within a window changes) and greedy (in order,
// a new sequence when the next example does not fit: torchtune's). An example longer than the
// sequence is cut to it, as TRL truncates to max_length before packing.

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

namespace loom::data {

enum class packing_strategy { first_fit_decreasing, greedy };
// "first_fit_decreasing" or "greedy"; std::invalid_argument naming both for another.
[[nodiscard]] packing_strategy packing_strategy_named(std::string_view name);
[[nodiscard]] std::string_view name_of(packing_strategy strategy) noexcept;
constexpr std::array<packing_strategy, 2> values_of(std::type_identity<packing_strategy>) noexcept {
  return {packing_strategy::first_fit_decreasing, packing_strategy::greedy};
}

// Which examples each sequence of `capacity` tokens holds, by index into `lengths`, in the order
// they are laid out. Deterministic: ties keep the examples' order. Every example is in exactly one
// sequence; one longer than `capacity` fills a sequence alone (and is cut to it).
[[nodiscard]] std::vector<std::vector<std::size_t>> pack(std::span<const std::int64_t> lengths, std::int64_t capacity,
                                                         packing_strategy strategy);

// One example: its tokens and their labels (-100 where a token is not predicted, as the prompt's).
struct example {
  std::vector<std::int32_t> ids;
  std::vector<std::int32_t> labels;
};

// A packed sequence of `capacity` tokens: the examples one after another, each token's position in
// its example, and the padding at the end (`pad_id`, labels -100, positions counting from 0 again as
// an example of its own).
struct packed_sequence {
  std::vector<std::int32_t> ids;
  std::vector<std::int32_t> labels;
  std::vector<std::int32_t> positions;
  std::int64_t tokens = 0;  // of examples, the rest padding
};
[[nodiscard]] packed_sequence lay_out(std::span<const example> examples, std::span<const std::size_t> chosen,
                                      std::int64_t capacity, std::int32_t pad_id);

}  // namespace loom::data

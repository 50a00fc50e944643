#include <loom/base/text.hpp>
#include <loom/data/packing.hpp>

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

namespace loom::data {

packing_strategy packing_strategy_named(std::string_view name) {
  if (name == "first_fit_decreasing") return packing_strategy::first_fit_decreasing;
  if (name == "greedy") return packing_strategy::greedy;
  throw_error<std::invalid_argument>("packing '{}': give first_fit_decreasing or greedy", name);
}

std::string_view name_of(packing_strategy strategy) noexcept {
  return strategy == packing_strategy::first_fit_decreasing ? "first_fit_decreasing" : "greedy";
}

std::vector<std::vector<std::size_t>> pack(std::span<const std::int64_t> lengths, std::int64_t capacity,
                                           packing_strategy strategy) {
  if (capacity < 1)
    throw_error<std::invalid_argument>("packing into sequences of {} tokens: give at least 1", capacity);
  const auto fitted = [&](std::size_t i) { return std::min(std::max<std::int64_t>(lengths[i], 0), capacity); };
  std::vector<std::vector<std::size_t>> sequences;
  std::vector<std::int64_t> room;
  if (strategy == packing_strategy::greedy) {
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      if (sequences.empty() || room.back() < fitted(i)) {
        sequences.emplace_back();
        room.push_back(capacity);
      }
      sequences.back().push_back(i);
      room.back() -= fitted(i);
    }
    return sequences;
  }
  std::vector<std::size_t> order(lengths.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return fitted(a) > fitted(b); });
  for (const std::size_t i : order) {
    const auto first_fit = std::find_if(room.begin(), room.end(), [&](std::int64_t left) { return left >= fitted(i); });
    if (first_fit == room.end()) {
      sequences.push_back({i});
      room.push_back(capacity - fitted(i));
    } else {
      sequences[static_cast<std::size_t>(first_fit - room.begin())].push_back(i);
      *first_fit -= fitted(i);
    }
  }
  return sequences;
}

packed_sequence lay_out(std::span<const example> examples, std::span<const std::size_t> chosen, std::int64_t capacity,
                        std::int32_t pad_id) {
  packed_sequence sequence;
  const auto size = static_cast<std::size_t>(capacity);
  sequence.ids.reserve(size);
  sequence.labels.reserve(size);
  sequence.positions.reserve(size);
  for (const std::size_t i : chosen) {
    const example& e = examples[i];
    if (e.ids.size() != e.labels.size()) {
      throw_error<std::invalid_argument>("packing: example {} has {} and {}", i,
                                         counted(static_cast<std::int64_t>(e.ids.size()), "token"),
                                         counted(static_cast<std::int64_t>(e.labels.size()), "label"));
    }
    const std::size_t kept = std::min(e.ids.size(), size - sequence.ids.size());
    sequence.ids.insert(sequence.ids.end(), e.ids.begin(), e.ids.begin() + static_cast<std::ptrdiff_t>(kept));
    sequence.labels.insert(sequence.labels.end(), e.labels.begin(),
                           e.labels.begin() + static_cast<std::ptrdiff_t>(kept));
    for (std::size_t p = 0; p < kept; ++p) sequence.positions.push_back(static_cast<std::int32_t>(p));
  }
  sequence.tokens = static_cast<std::int64_t>(sequence.ids.size());
  for (std::int32_t p = 0; sequence.ids.size() < size; ++p) {
    sequence.ids.push_back(pad_id);
    sequence.labels.push_back(-100);
    sequence.positions.push_back(p);
  }
  return sequence;
}

}  // namespace loom::data

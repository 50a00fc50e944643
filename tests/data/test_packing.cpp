// loom::data::pack and lay_out: first-fit decreasing and greedy on lengths whose answer is worked by
// hand, every example in exactly one sequence within its room on random lengths, and a laid-out
// sequence's positions, labels and padding.
#include <loom/data/packing.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_exception.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

using Catch::Matchers::ContainsSubstring;
using loom::data::packing_strategy;

TEST_CASE("first-fit decreasing and greedy packing, worked by hand", "[packing]") {
  const std::vector<std::int64_t> lengths{5, 9, 3, 7, 2, 8};
  using sequences = std::vector<std::vector<std::size_t>>;
  // 9, 8, 7 and 5 each open a sequence; 3 fits beside the 7, 2 beside the 8.
  CHECK(loom::data::pack(lengths, 10, packing_strategy::first_fit_decreasing) == sequences{{1}, {5, 4}, {3, 2}, {0}});
  CHECK(loom::data::pack(lengths, 10, packing_strategy::greedy) == sequences{{0}, {1}, {2, 3}, {4, 5}});
  // Longer than a sequence: alone, in either.
  CHECK(loom::data::pack(std::vector<std::int64_t>{3, 12, 4}, 10, packing_strategy::greedy) ==
        sequences{{0}, {1}, {2}});
  CHECK(loom::data::pack(std::vector<std::int64_t>{3, 12, 4}, 10, packing_strategy::first_fit_decreasing) ==
        sequences{{1}, {2, 0}});
  CHECK(loom::data::pack(std::vector<std::int64_t>{}, 10, packing_strategy::greedy).empty());
  CHECK_THROWS_WITH(loom::data::pack(lengths, 0, packing_strategy::greedy), ContainsSubstring("give at least 1"));
  CHECK(loom::data::packing_strategy_named("greedy") == packing_strategy::greedy);
  CHECK_THROWS_WITH(loom::data::packing_strategy_named("bfd"),
                    ContainsSubstring("packing 'bfd': give first_fit_decreasing or greedy"));
}

TEST_CASE("every example is packed once, within its sequence's room", "[packing]") {
  std::mt19937_64 random(7);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<std::int64_t> lengths(random() % 200);
    for (auto& length : lengths) length = 1 + static_cast<std::int64_t>(random() % 64);
    for (const auto strategy : {packing_strategy::first_fit_decreasing, packing_strategy::greedy}) {
      const auto sequences = loom::data::pack(lengths, 64, strategy);
      std::vector<int> seen(lengths.size(), 0);
      std::int64_t total = 0;
      for (const auto& sequence : sequences) {
        std::int64_t used = 0;
        for (const std::size_t i : sequence) {
          ++seen[i];
          used += lengths[i];
        }
        CHECK(used <= 64);
        total += used;
      }
      CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
      // No two sequences of first-fit decreasing would fit in one: at most one is half empty or more.
      if (strategy == packing_strategy::first_fit_decreasing) {
        const auto half_empty = std::count_if(sequences.begin(), sequences.end(), [&](const auto& sequence) {
          std::int64_t used = 0;
          for (const std::size_t i : sequence) used += lengths[i];
          return used <= 32;
        });
        CHECK(half_empty <= 1);
      }
    }
  }
}

TEST_CASE("a laid-out sequence: each example from position 0, then padding without labels", "[packing]") {
  const std::vector<loom::data::example> examples{{{10, 11, 12}, {-100, 11, 12}}, {{20, 21}, {20, 21}}};
  const std::vector<std::size_t> chosen{1, 0};
  const loom::data::packed_sequence sequence = loom::data::lay_out(examples, chosen, 8, 0);
  CHECK(sequence.ids == std::vector<std::int32_t>{20, 21, 10, 11, 12, 0, 0, 0});
  CHECK(sequence.labels == std::vector<std::int32_t>{20, 21, -100, 11, 12, -100, -100, -100});
  CHECK(sequence.positions == std::vector<std::int32_t>{0, 1, 0, 1, 2, 0, 1, 2});
  CHECK(sequence.tokens == 5);
  // Cut at the sequence's end.
  CHECK(loom::data::lay_out(examples, chosen, 4, 0).ids == std::vector<std::int32_t>{20, 21, 10, 11});
  const std::vector<loom::data::example> uneven{{{1, 2}, {1}}};
  CHECK_THROWS_WITH(loom::data::lay_out(uneven, std::vector<std::size_t>{0}, 4, 0),
                    ContainsSubstring("example 0 has 2 tokens and 1 label"));
}

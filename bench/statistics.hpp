#pragma once
// What the benchmarks report of repeated runs: medians, and the spread of paired ratios.

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

namespace bench {

// As Python's statistics.median: the mean of the middle two for an even count.
inline double median(std::vector<double> values) {
  std::ranges::sort(values);
  const std::size_t middle = values.size() / 2;
  return values.size() % 2 == 1 ? values[middle] : (values[middle - 1] + values[middle]) / 2;
}

// "0.912-1.034": the lowest and the highest of `values`.
inline std::string spread(const std::vector<double>& values) {
  const auto [low, high] = std::ranges::minmax(values);
  return fmt::format("{:.3f}-{:.3f}", low, high);
}

}  // namespace bench

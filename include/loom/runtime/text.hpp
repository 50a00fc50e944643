#pragma once
// The words of loom's own lines (build notes, errors): one voice for counts.

#include <cstdint>
#include <string>
#include <string_view>

namespace loom {

// "1 gradient bucket", "2 gradient buckets": a count that agrees with its noun (regular plurals).
[[nodiscard]] inline std::string counted(std::int64_t count, std::string_view noun) {
  std::string text = std::to_string(count);
  text.append(" ").append(noun);
  if (count != 1) text += 's';
  return text;
}

}  // namespace loom

#pragma once
// The words of loom's own lines (build notes, errors): one voice for counts, and the one place
// that writes the "loom: " every error of loom's starts with.

#include <fmt/format.h>

#include <cstdint>
#include <iterator>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom {

inline constexpr std::string_view message_prefix = "loom: ";

// "loom: " and the formatted text: a message in loom's voice.
template <class... Args>
[[nodiscard]] std::string error_message(fmt::format_string<Args...> format, Args&&... args) {
  std::string text(message_prefix);
  fmt::format_to(std::back_inserter(text), format, std::forward<Args>(args)...);
  return text;
}

// Throws E(error_message(format, args...)): how loom raises an error of its own.
template <class E, class... Args>
[[noreturn]] void throw_error(fmt::format_string<Args...> format, Args&&... args) {
  throw E(error_message(format, std::forward<Args>(args)...));
}

// "1 gradient bucket", "2 gradient buckets": a count that agrees with its noun (regular plurals).
[[nodiscard]] inline std::string counted(std::int64_t count, std::string_view noun) {
  std::string text = std::to_string(count);
  text.append(" ").append(noun);
  if (count != 1) text += 's';
  return text;
}

// "a, b, c": up to a dozen names, then how many more ("(none)" for none).
[[nodiscard]] inline std::string some_of(const std::vector<std::string>& names) {
  constexpr std::size_t listed = 12;
  if (names.empty()) return "(none)";
  std::string text;
  for (std::size_t i = 0; i < names.size() && i < listed; ++i) text.append(i == 0 ? "" : ", ").append(names[i]);
  if (names.size() > listed) text += fmt::format(" and {} more", names.size() - listed);
  return text;
}

}  // namespace loom

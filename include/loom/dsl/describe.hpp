// Pieces of describe(): a stable, locale-independent text for each option value.
#pragma once

#include <loom/dsl/dtype.hpp>
#include <loom/dsl/targets.hpp>

#include <charconv>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

namespace loom::detail {

// The name of T as the compiler spells it ("demo::TinyGpt"), read from the signature of this
// function.
template <class T>
constexpr std::string_view type_name() noexcept {
  constexpr std::string_view signature = __PRETTY_FUNCTION__;  // g++ and clang
  constexpr std::string_view key = "T = ";
  constexpr std::size_t begin = signature.find(key) + key.size();
  constexpr std::size_t semicolon = signature.find(';', begin);  // g++: "[with T = X; ...]"
  constexpr std::size_t end = semicolon != std::string_view::npos ? semicolon : signature.rfind(']');
  return signature.substr(begin, end - begin);
}

inline std::string to_text(bool value) { return value ? "true" : "false"; }

// Shortest text that reads back as the same double: 16, 0.05, 1e-05.
inline std::string to_text(double value) {
  char buffer[32];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return {buffer, result.ptr};
}

template <class Integer>
requires std::is_integral_v<Integer> std::string to_text(Integer value) { return std::to_string(value); }

inline std::string to_text(dtype value) { return std::string(name_of(value)); }

// An enumeration that names its values (name_of, found by argument-dependent lookup).
template <class E>
requires std::is_enum_v<E> && requires(E value) { name_of(value); }
std::string to_text(E value) { return std::string(name_of(value)); }

// An option left unset prints as "none".
inline std::string to_text(const std::optional<dtype>& value) { return value ? to_text(*value) : "none"; }

// [q_proj, pattern("blocks\.\d+\.attn")]
inline std::string to_text(const target_list& list) {
  std::string text = "[";
  for (const target& entry : list) {
    if (text.size() > 1) text += ", ";
    if (entry.kind == target_kind::pattern) {
      text.append("pattern(\"").append(entry.text).append("\")");
    } else {  // a name, or all-linear
      text.append(entry.text);
    }
  }
  return text + "]";
}

// "name(options)": one line of describe().
inline std::string call_text(std::string_view name, std::string_view options) {
  return std::string(name).append("(").append(options).append(")");
}

}  // namespace loom::detail

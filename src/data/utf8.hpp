#pragma once
// UTF-8 as the tokenizer needs it: where a text stops being well-formed (RFC 3629), its code points,
// Unicode's White_Space and word characters, and decoded bytes made text as Rust's
// String::from_utf8_lossy makes them.
// Private to the data wing.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace loom::data::detail {

// The offset of the first byte that does not start a well-formed UTF-8 sequence, if any.
[[nodiscard]] std::optional<std::size_t> invalid_utf8_at(std::string_view text);
// The length of the UTF-8 sequence that starts with the byte `lead` (valid UTF-8).
[[nodiscard]] constexpr std::size_t utf8_length(unsigned char lead) {
  return lead < 0x80U ? 1 : lead < 0xE0U ? 2 : lead < 0xF0U ? 3 : 4;
}
// The code point at `at` and its length (valid UTF-8).
[[nodiscard]] std::pair<std::uint32_t, std::size_t> code_point_at(std::string_view text, std::size_t at);
void append_utf8(std::string& out, std::uint32_t code_point);
// Rust's char::is_whitespace (Unicode's White_Space), which added tokens' lstrip and rstrip use.
[[nodiscard]] bool is_whitespace(std::uint32_t c);
// Rust's regex \w (Unicode's Alphabetic, marks, decimal digits, connector punctuation, the joiners),
// which single_word added tokens look for on either side; by utf8proc's Unicode data.
[[nodiscard]] bool is_word_character(std::uint32_t c);
// Invalid UTF-8 as Rust's String::from_utf8_lossy writes it: each maximal bad prefix one U+FFFD.
[[nodiscard]] std::string lossy_utf8(std::string_view bytes);

}  // namespace loom::data::detail

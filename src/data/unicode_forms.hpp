#pragma once
// Unicode's normalization forms (NFC, NFD, NFKC, NFKD) over UTF-8 text, through utf8proc (Debian's
// libutf8proc-dev, the library Julia's strings use): tokenizer.json's normalizers of those names
// (Qwen2's files have NFC). Private to the data wing.

#include <optional>
#include <string>
#include <string_view>

namespace loom::data::detail {

enum class unicode_form { nfc, nfd, nfkc, nfkd };

// The form a tokenizer.json normalizer's type names ("NFC", ...), if it names one.
[[nodiscard]] std::optional<unicode_form> unicode_form_named(std::string_view type);

// `text` (valid UTF-8) in `form`; throws std::runtime_error naming utf8proc's error, which valid
// input does not give.
[[nodiscard]] std::string normalized(unicode_form form, std::string_view text);

}  // namespace loom::data::detail

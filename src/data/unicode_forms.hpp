#pragma once
// Unicode's normalization forms (NFC, NFD, NFKC, NFKD) over UTF-8 text, through utf8proc's character
// data (Debian's libutf8proc-dev, the library Julia's strings use): tokenizer.json's normalizers of
// those names (Qwen2's files have NFC). Each character comes with how it stands to the text before, as
// the tokenizers library's normalizers give it (they run the unicode-normalization-alignments crate),
// so that a token's offsets point back into the text it was given. Private to the data wing.

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace loom::data::detail {

enum class unicode_form { nfc, nfd, nfkc, nfkd };

// The form a tokenizer.json normalizer's type names ("NFC", ...), if it names one.
[[nodiscard]] std::optional<unicode_form> unicode_form_named(std::string_view type);

// A character of a normalized text and its change, the library's (char, isize) pairs that
// NormalizedString::transform reads: 0, it takes the place of the next character of the text before;
// n > 0, it is inserted after the previous one; -n, it takes the place of the next character and the
// n after that one go.
struct changed_character {
  std::uint32_t code_point;
  int change;
};

// `text` (valid UTF-8) in `form`, character by character, with the changes the crate gives: each
// character's full decomposition (its first character 0, the others +1), each run of combining marks
// stably sorted by combining class (a change moving with its character), then, for NFC and NFKC,
// each composition of a starter with what follows it (the composite's change the two's sum less
// one). The characters are the form's whatever the order of the changes.
[[nodiscard]] std::vector<changed_character> normalized_characters(unicode_form form, std::string_view text);

}  // namespace loom::data::detail

#pragma once
// The stages of a tokenizer.json pipeline around its model: the normalizers, the pre-tokenizers (a
// Split by a pattern, GPT-2's byte-level map, Metaspace) and the decoders, each as the tokenizers
// library runs it. The text goes through the normalizers and pre-tokenizers with, for each of its
// bytes, the bytes of the given text it stands for (the library's NormalizedString alignments), so
// that each token's offsets in the given text come out as the library's. Private to the data wing;
// tokenizer.cpp reads them from the file.

#include "regex.hpp"
#include "unicode_forms.hpp"

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace loom::data::detail {

inline constexpr std::string_view metaspace_default = "\u2581";
// The pattern GPT-2's byte-level pre-tokenizer splits by (use_regex), as the tokenizers library has it.
inline constexpr std::string_view gpt2_pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Bytes [begin, end) of the text given to encode.
struct byte_span {
  std::size_t begin = 0, end = 0;
  friend bool operator==(const byte_span&, const byte_span&) = default;
};

// Text on its way to the model, each of its bytes with the span of the given text it stands for: the
// span of the character it is, or came from (all bytes of a character share one), or, for what a
// stage inserted, the span of the character it was inserted at.
struct aligned_text {
  std::string text;
  std::vector<byte_span> origins;  // one a byte of `text`

  // `text` as given, starting at byte `at` of the whole: each byte the span of its own character.
  [[nodiscard]] static aligned_text given(std::string_view text, std::size_t at);
  // The span of the given text that bytes [begin, end) (not empty) cover: from the first byte's start
  // to the last byte's end, as the library expands alignments (a reordering NFC can make it run
  // backwards, and then it is left so).
  [[nodiscard]] byte_span origin_of(std::size_t begin, std::size_t end) const {
    return {origins[begin].begin, origins[end - 1].end};
  }
};

// The pieces a text is cut into on its way to the model: ranges of one aligned text, in order, each
// with the index of the stretch it was cut from (the stretches between added tokens are cut apart
// together). A stage that rewrites pieces writes them all into a new text, a stage that only cuts
// them leaves the text as it is: no piece has a string of its own.
struct piece {
  std::size_t begin, end;
  std::size_t stretch;
};
struct pieces {
  aligned_text text;
  std::vector<piece> list;

  [[nodiscard]] std::string_view text_of(const piece& p) const {
    return std::string_view(text.text).substr(p.begin, p.end - p.begin);
  }
};

enum class split_behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

struct split_stage {
  regex pattern;
  split_behavior behavior;
  bool invert = false;
};
struct byte_level_stage {
  bool add_prefix_space = false;
  std::optional<regex> gpt2;  // use_regex
};
struct metaspace_stage {
  std::string replacement{metaspace_default};
  enum class prepend { always, first, never } scheme = prepend::always;
  bool split = true;
};
using pre_tokenizer = std::variant<split_stage, byte_level_stage, metaspace_stage>;

struct prepend_normalizer {
  std::string prefix;
};
struct replace_normalizer {
  regex pattern;
  std::string content;
};
struct unicode_normalizer {
  unicode_form form;
};
using normalizer = std::variant<prepend_normalizer, replace_normalizer, unicode_normalizer>;

struct replace_decoder {
  std::string pattern, content;  // a string pattern (the decoders' Replace takes no regex here)
};
struct byte_fallback_decoder {};
struct fuse_decoder {};
struct strip_decoder {
  std::string content;
  std::size_t start = 0, stop = 0;
};
struct byte_level_decoder {};
struct metaspace_decoder {
  std::string replacement{metaspace_default};
  bool strip_first = true;  // prepend_scheme other than never
};
using decoder = std::variant<replace_decoder, byte_fallback_decoder, fuse_decoder, strip_decoder, byte_level_decoder,
                             metaspace_decoder>;

// Each piece cut or changed by `stage`, in order.
void pre_tokenize(const pre_tokenizer& stage, pieces& cut);
void normalize(const std::vector<normalizer>& normalizers, aligned_text& text);
// The normalizers' output alone (an added token's normalized content).
[[nodiscard]] std::string normalize(const std::vector<normalizer>& normalizers, std::string_view text);
void apply_decoder(const decoder& stage, std::vector<std::string>& tokens);

}  // namespace loom::data::detail

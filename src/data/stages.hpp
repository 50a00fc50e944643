#pragma once
// The stages of a tokenizer.json pipeline around its model: the normalizers, the pre-tokenizers (a
// Split by a pattern, GPT-2's byte-level map, Metaspace) and the decoders, each as the tokenizers
// library runs it. Private to the data wing; tokenizer.cpp reads them from the file.

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

// A piece of text on its way to the model, and whether it starts the text (Metaspace's "first").
struct piece {
  std::string text;
  bool at_start = false;
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
void pre_tokenize(const pre_tokenizer& stage, std::vector<piece>& pieces);
[[nodiscard]] std::string normalize(const std::vector<normalizer>& normalizers, std::string text);
void apply_decoder(const decoder& stage, std::vector<std::string>& tokens);

}  // namespace loom::data::detail

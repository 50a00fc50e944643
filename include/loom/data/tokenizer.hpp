#pragma once
// loom::data::tokenizer: Hugging Face's tokenizer.json read in C++, for the BPE models the families
// loom trains use: byte-level BPE as GPT-2, Llama 3 and Qwen write it (a Split of the text by a
// regular expression, GPT-2's byte-to-character map, merges) and SentencePiece-style BPE with byte
// fallback as Llama 2, Mistral and Gemma write it (Prepend / Replace normalizers or the Metaspace
// pre-tokenizer, `<0xNN>` byte tokens). Added and special tokens are matched as the `tokenizers`
// library matches them: those marked "normalized": false in the text as given, first; the others in
// the normalizer's output. encode() is `tokenizer.encode(text, add_special_tokens=False).ids` and
// decode() its `decode(ids, skip_special_tokens=...)`; the post-processor (a BOS the template adds)
// is left to the caller, who knows where a document starts, but for the offsets it narrows
// (trim_offsets). encode_with_offsets() gives each token's span of the text too, the library's
// `.offsets` (transformers' return_offsets_mapping) in bytes: which tokens cover a byte range of a
// rendered chat, say.
//
// A file that asks for what this reader does not do (another model, normalizer, pre-tokenizer or
// decoder type; BPE dropout; continuing-subword prefixes) is refused naming the key and its value.
// Text that is not valid UTF-8 is refused naming the byte offset of the first bad sequence: the
// `tokenizers` library takes only Unicode strings, so there is no behaviour of its to follow.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::data {

class tokenizer {
 public:
  // dir/tokenizer.json, with the BOS and EOS tokens named by dir/tokenizer_config.json when it has
  // them (else by the file's own special tokens, where one is plainly a BOS or EOS).
  [[nodiscard]] static tokenizer from_pretrained(const std::filesystem::path& dir);
  // One tokenizer.json, no tokenizer_config.json.
  [[nodiscard]] static tokenizer from_file(const std::filesystem::path& tokenizer_json);

  tokenizer(tokenizer&&) noexcept;
  tokenizer& operator=(tokenizer&&) noexcept;
  ~tokenizer();

  [[nodiscard]] std::vector<std::int32_t> encode(std::string_view text) const;

  // encode(text) with each token's byte range [begin, end) in `text`, as the tokenizers library's
  // offsets (return_offsets_mapping) give them, in bytes of the UTF-8 input rather than characters.
  // A token stands for the characters its normalized text came from: a byte-level or byte-fallback
  // token cut from one character spans that whole character, as do the others cut from it; what a
  // normalizer or pre-tokenizer inserts (Llama 2's leading "▁") spans the character it was inserted
  // at; a composed character (NFC) spans the first of those it was composed from; an added token
  // spans the whitespace its lstrip and rstrip took in, less what trim_offsets takes off.
  struct encoding {
    std::vector<std::int32_t> ids;
    std::vector<std::pair<std::size_t, std::size_t>> offsets;  // one a token
  };
  [[nodiscard]] encoding encode_with_offsets(std::string_view text) const;
  [[nodiscard]] std::string decode(std::span<const std::int32_t> ids, bool skip_special_tokens = false) const;

  [[nodiscard]] std::optional<std::int32_t> token_to_id(std::string_view token) const;
  // The model's vocabulary and the added tokens: one more than the largest id.
  [[nodiscard]] std::int64_t vocab_size() const;
  [[nodiscard]] std::optional<std::int32_t> bos_token_id() const;
  [[nodiscard]] std::optional<std::int32_t> eos_token_id() const;

  struct impl;

 private:
  explicit tokenizer(std::unique_ptr<impl> core);
  std::unique_ptr<impl> core_;
};

}  // namespace loom::data

#pragma once
// The BPE model of tokenizer.json ("model": {"type": "BPE"}): a word's characters, merged pair by pair
// in the order of the merges list (lowest rank first, leftmost first among equals), then looked up
// in the vocabulary; a character the vocabulary lacks becomes its UTF-8 bytes' <0xNN> tokens under
// byte_fallback, else the unknown token (consecutive ones fused under fuse_unk). Each token covers
// the bytes of the word its symbols came from (a byte token, its one byte). Words already encoded are
// remembered. Private to the data wing.

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace loom::data::detail {

struct bpe_settings {
  std::optional<std::int32_t> unk;
  bool byte_fallback = false;
  bool fuse_unk = false;
  bool ignore_merges = false;  // a word that is in the vocabulary whole is that token (Llama 3)
};

// A word's tokens and where each ends in the word, in bytes (each starts where the one before ends):
// the library's Word offsets.
struct word_tokens {
  std::vector<std::int32_t> ids;
  std::vector<std::size_t> ends;
};

class bpe {
 public:
  // `merges`: pairs of tokens, highest priority first. Throws std::invalid_argument naming a merge
  // whose tokens, or whose result, the vocabulary lacks.
  bpe(std::unordered_map<std::string, std::int32_t> vocab,
      const std::vector<std::pair<std::string, std::string>>& merges, bpe_settings settings);

  // `word`'s tokens, in `out` (its contents replaced). Throws std::invalid_argument for a character
  // with no token, no byte fallback and no unknown token.
  void encode_word(std::string_view word, word_tokens& out) const;

  [[nodiscard]] const std::unordered_map<std::string, std::int32_t>& vocab() const noexcept { return vocab_; }

 private:
  struct merge {
    std::uint32_t rank;
    std::int32_t merged;
  };
  [[nodiscard]] word_tokens merged_word(std::string_view word) const;

  std::unordered_map<std::string, std::int32_t> vocab_;
  std::unordered_map<std::uint64_t, merge> merges_;  // (left << 32 | right) -> rank and result
  std::int32_t byte_tokens_[256] = {};               // <0xNN>'s ids, -1 where missing
  bpe_settings settings_;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, word_tokens> cache_;
};

}  // namespace loom::data::detail

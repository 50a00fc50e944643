#include "bpe.hpp"

#include "utf8.hpp"

#include <loom/base/text.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <queue>
#include <stdexcept>
#include <tuple>

namespace loom::data::detail {
namespace {

constexpr std::size_t cache_limit = 1 << 16;    // words remembered; then the cache starts afresh
constexpr std::size_t cached_word_bytes = 256;  // longer words are not remembered, as the tokenizers library's

std::uint64_t pair_key(std::int32_t left, std::int32_t right) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(left)) << 32U) | static_cast<std::uint32_t>(right);
}

}  // namespace

bpe::bpe(std::unordered_map<std::string, std::int32_t> vocab,
         const std::vector<std::pair<std::string, std::string>>& merges, bpe_settings settings)
    : vocab_(std::move(vocab)), settings_(settings) {
  const auto id_of = [&](const std::string& token, std::size_t rank) {
    const auto found = vocab_.find(token);
    if (found == vocab_.end()) {
      throw_error<std::invalid_argument>(
          "tokenizer.json's model.merges[{}] needs the token '{}', which model.vocab does not have", rank, token);
    }
    return found->second;
  };
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    const std::uint64_t key = pair_key(id_of(left, rank), id_of(right, rank));
    merges_.try_emplace(key, merge{static_cast<std::uint32_t>(rank), id_of(left + right, rank)});
  }
  for (int byte = 0; byte < 256; ++byte) {
    const auto found = vocab_.find(fmt::format("<0x{:02X}>", byte));
    byte_tokens_[byte] = found == vocab_.end() ? -1 : found->second;
  }
}

word_tokens bpe::merged_word(std::string_view word) const {
  if (settings_.ignore_merges) {
    if (const auto whole = vocab_.find(std::string(word)); whole != vocab_.end())
      return {{whole->second}, {word.size()}};
  }
  // The word's symbols, each with the bytes of the word it covers: one per character, or its bytes'
  // tokens, or the unknown token. As in the library, an unknown token waits until a character of the
  // vocabulary (or the word's end) comes, fusing with the unknown ones after it under fuse_unk: byte
  // tokens in between go before it.
  std::vector<std::int32_t> symbols;
  std::vector<std::size_t> starts;  // where each symbol starts: the bytes of those before it
  symbols.reserve(word.size());
  starts.reserve(word.size());
  std::size_t covered = 0;
  std::size_t unknown_length = 0;  // the waiting unknown token's bytes; 0 where none waits
  const auto add = [&](std::int32_t id, std::size_t length) {
    symbols.push_back(id);
    starts.push_back(covered);
    covered += length;
  };
  const auto add_waiting_unknown = [&] {
    if (unknown_length > 0) add(*settings_.unk, unknown_length);
    unknown_length = 0;
  };
  for (std::size_t at = 0; at < word.size();) {
    const std::size_t length = std::min(utf8_length(static_cast<unsigned char>(word[at])), word.size() - at);
    const std::string character(word.substr(at, length));
    if (const auto found = vocab_.find(character); found != vocab_.end()) {
      add_waiting_unknown();
      add(found->second, length);
    } else if (settings_.byte_fallback && std::ranges::all_of(character, [&](char c) {
                 return byte_tokens_[static_cast<unsigned char>(c)] >= 0;
               })) {
      for (const char c : character) add(byte_tokens_[static_cast<unsigned char>(c)], 1);
    } else if (settings_.unk) {
      if (unknown_length > 0 && settings_.fuse_unk) {
        unknown_length += length;
      } else {
        add_waiting_unknown();
        unknown_length = length;
      }
    } else {
      throw_error<std::invalid_argument>(
          "the tokenizer has no token for the character '{}' (byte offset {} of the word '{}'), no byte fallback and "
          "no unknown token (model.unk_token)",
          character, at, word);
    }
    at += length;
  }
  add_waiting_unknown();
  // Merge by rank, leftmost first among equals, over a linked list of the symbols.
  const auto count = static_cast<std::int32_t>(symbols.size());
  std::vector<std::int32_t> next(symbols.size()), previous(symbols.size());
  for (std::int32_t i = 0; i < count; ++i) {
    next[i] = i + 1 < count ? i + 1 : -1;
    previous[i] = i - 1;
  }
  using candidate = std::tuple<std::uint32_t, std::int32_t, std::int32_t>;  // rank, position, merged id
  std::priority_queue<candidate, std::vector<candidate>, std::greater<>> queue;
  const auto offer = [&](std::int32_t at) {
    if (at < 0 || next[at] < 0) return;
    if (const auto found = merges_.find(pair_key(symbols[at], symbols[next[at]])); found != merges_.end())
      queue.emplace(found->second.rank, at, found->second.merged);
  };
  for (std::int32_t i = 0; i + 1 < count; ++i) offer(i);
  std::vector<bool> gone(symbols.size(), false);
  while (!queue.empty()) {
    const auto [rank, at, merged] = queue.top();
    queue.pop();
    if (gone[at] || next[at] < 0) continue;
    const auto still = merges_.find(pair_key(symbols[at], symbols[next[at]]));
    if (still == merges_.end() || still->second.merged != merged || still->second.rank != rank) continue;
    const std::int32_t right = next[at];
    symbols[at] = merged;
    gone[right] = true;
    next[at] = next[right];
    if (next[at] >= 0) previous[next[at]] = at;
    offer(previous[at]);
    offer(at);
  }
  // A merged symbol covers those from its position to the next one left: it ends where that one starts.
  word_tokens tokens;
  for (std::int32_t i = 0; i < count; ++i) {
    if (gone[i]) continue;
    if (!tokens.ids.empty()) tokens.ends.push_back(starts[i]);
    tokens.ids.push_back(symbols[i]);
  }
  if (!tokens.ids.empty()) tokens.ends.push_back(covered);
  return tokens;
}

void bpe::encode_word(std::string_view word, word_tokens& out) const {
  if (word.size() < cached_word_bytes) {
    const std::lock_guard lock(cache_mutex_);
    if (const auto found = cache_.find(std::string(word)); found != cache_.end()) {
      out.ids.assign(found->second.ids.begin(), found->second.ids.end());
      out.ends.assign(found->second.ends.begin(), found->second.ends.end());
      return;
    }
  }
  out = merged_word(word);
  if (word.size() >= cached_word_bytes) return;
  const std::lock_guard lock(cache_mutex_);
  if (cache_.size() >= cache_limit) cache_.clear();
  cache_.emplace(word, out);
}

}  // namespace loom::data::detail

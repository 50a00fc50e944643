#pragma once
// A compiled regular expression over UTF-8 text (PCRE2, Unicode properties on, JIT-compiled where the
// machine allows): what tokenizer.json's Split patterns and GPT-2's pre-tokenizing pattern need,
// Unicode classes (\p{L}, \p{N}), look-ahead and case-insensitive groups among them. Private to the
// data wing.

#include <cstddef>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::data::detail {

class regex {
 public:
  // Throws std::invalid_argument naming PCRE2's reason and the offset in `pattern`. `literal`: the
  // pattern is a string to find, not an expression.
  explicit regex(std::string_view pattern, bool literal = false);
  regex(regex&&) noexcept;
  regex& operator=(regex&&) noexcept;
  ~regex();

  // The [begin, end) byte spans of the non-overlapping, non-empty matches in `text` (valid UTF-8),
  // left to right.
  [[nodiscard]] std::vector<std::pair<std::size_t, std::size_t>> matches(std::string_view text) const;

 private:
  struct compiled;
  std::unique_ptr<compiled> code_;
};

}  // namespace loom::data::detail

#include "regex.hpp"

#include <loom/base/text.hpp>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdexcept>
#include <string>

namespace loom::data::detail {

struct regex::compiled {
  pcre2_code* code = nullptr;
  ~compiled() { pcre2_code_free(code); }
};

regex::regex(std::string_view pattern, bool literal) : code_(std::make_unique<compiled>()) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  // PCRE2_UCP: \s, \d and \w by Unicode properties, as the regex engine of the tokenizers library has them.
  const std::uint32_t options = PCRE2_UTF | PCRE2_NO_UTF_CHECK | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  code_->code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &error, &offset, nullptr);
  if (code_->code == nullptr) {
    std::string reason(256, '\0');
    const int length = pcre2_get_error_message(error, reinterpret_cast<PCRE2_UCHAR*>(reason.data()), reason.size());
    reason.resize(length > 0 ? static_cast<std::size_t>(length) : 0);
    throw_error<std::invalid_argument>("the pattern '{}' is not a regular expression PCRE2 takes: {} at offset {}",
                                       pattern, reason, offset);
  }
  (void)pcre2_jit_compile(code_->code, PCRE2_JIT_COMPLETE);  // without JIT it still matches, slower
}

regex::regex(regex&&) noexcept = default;
regex& regex::operator=(regex&&) noexcept = default;
regex::~regex() = default;

std::vector<std::pair<std::size_t, std::size_t>> regex::matches(std::string_view text) const {
  struct match_data_deleter {
    void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
  };
  const std::unique_ptr<pcre2_match_data, match_data_deleter> data(
      pcre2_match_data_create_from_pattern(code_->code, nullptr));
  std::vector<std::pair<std::size_t, std::size_t>> found;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t start = 0;
  while (start < text.size()) {
    const int result = pcre2_match(code_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, data.get(), nullptr);
    if (result == PCRE2_ERROR_NOMATCH) break;
    if (result < 0) throw_error<std::runtime_error>("matching a tokenizer's pattern failed (PCRE2 error {})", result);
    const PCRE2_SIZE* span = pcre2_get_ovector_pointer(data.get());
    if (span[1] > span[0]) {
      found.emplace_back(span[0], span[1]);
      start = span[1];
    } else {  // an empty match: go on from the next character
      start = span[0] + 1;
      while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0U) == 0x80U) ++start;
    }
  }
  return found;
}

}  // namespace loom::data::detail

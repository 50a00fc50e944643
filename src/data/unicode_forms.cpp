#include "unicode_forms.hpp"

#include <fmt/format.h>
#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <stdexcept>

namespace loom::data::detail {

std::optional<unicode_form> unicode_form_named(std::string_view type) {
  if (type == "NFC") return unicode_form::nfc;
  if (type == "NFD") return unicode_form::nfd;
  if (type == "NFKC") return unicode_form::nfkc;
  if (type == "NFKD") return unicode_form::nfkd;
  return std::nullopt;
}

std::string normalized(unicode_form form, std::string_view text) {
  // ASCII is in every form already: most text is returned as it is, without a pass through utf8proc.
  if (std::all_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; })) {
    return std::string(text);
  }
  int options = UTF8PROC_STABLE;
  switch (form) {
    case unicode_form::nfc: options |= UTF8PROC_COMPOSE; break;
    case unicode_form::nfd: options |= UTF8PROC_DECOMPOSE; break;
    case unicode_form::nfkc: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case unicode_form::nfkd: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  utf8proc_uint8_t* mapped = nullptr;
  const utf8proc_ssize_t length =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()), static_cast<utf8proc_ssize_t>(text.size()),
                   &mapped, static_cast<utf8proc_option_t>(options));
  const std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(mapped, &std::free);
  if (length < 0) throw std::runtime_error(fmt::format("Unicode normalization failed: {}", utf8proc_errmsg(length)));
  return std::string(reinterpret_cast<const char*>(mapped), static_cast<std::size_t>(length));
}

}  // namespace loom::data::detail

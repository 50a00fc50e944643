#include "utf8.hpp"

#include <utf8proc.h>

namespace loom::data::detail {

std::optional<std::size_t> invalid_utf8_at(std::string_view text) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  for (std::size_t at = 0; at < text.size();) {
    const unsigned char lead = bytes[at];
    std::size_t length = 0;
    std::uint32_t low = 0x80, high = 0xBF;  // the second byte's range (RFC 3629's table)
    if (lead < 0x80U) {
      ++at;
      continue;
    }
    if (lead >= 0xC2U && lead <= 0xDFU) {
      length = 2;
    } else if (lead >= 0xE0U && lead <= 0xEFU) {
      length = 3;
      if (lead == 0xE0U) low = 0xA0;
      if (lead == 0xEDU) high = 0x9F;
    } else if (lead >= 0xF0U && lead <= 0xF4U) {
      length = 4;
      if (lead == 0xF0U) low = 0x90;
      if (lead == 0xF4U) high = 0x8F;
    } else {
      return at;
    }
    if (at + length > text.size() || bytes[at + 1] < low || bytes[at + 1] > high) return at;
    for (std::size_t k = 2; k < length; ++k)
      if ((bytes[at + k] & 0xC0U) != 0x80U) return at;
    at += length;
  }
  return std::nullopt;
}

std::pair<std::uint32_t, std::size_t> code_point_at(std::string_view text, std::size_t at) {
  const auto byte = [&](std::size_t k) { return static_cast<std::uint32_t>(static_cast<unsigned char>(text[at + k])); };
  const std::uint32_t lead = byte(0);
  if (lead < 0x80U) return {lead, 1};
  if (lead < 0xE0U) return {((lead & 0x1FU) << 6U) | (byte(1) & 0x3FU), 2};
  if (lead < 0xF0U) return {((lead & 0x0FU) << 12U) | ((byte(1) & 0x3FU) << 6U) | (byte(2) & 0x3FU), 3};
  return {((lead & 0x07U) << 18U) | ((byte(1) & 0x3FU) << 12U) | ((byte(2) & 0x3FU) << 6U) | (byte(3) & 0x3FU), 4};
}

void append_utf8(std::string& out, std::uint32_t code_point) {
  if (code_point < 0x80U) {
    out += static_cast<char>(code_point);
  } else if (code_point < 0x800U) {
    out += static_cast<char>(0xC0U | (code_point >> 6U));
    out += static_cast<char>(0x80U | (code_point & 0x3FU));
  } else if (code_point < 0x10000U) {
    out += static_cast<char>(0xE0U | (code_point >> 12U));
    out += static_cast<char>(0x80U | ((code_point >> 6U) & 0x3FU));
    out += static_cast<char>(0x80U | (code_point & 0x3FU));
  } else {
    out += static_cast<char>(0xF0U | (code_point >> 18U));
    out += static_cast<char>(0x80U | ((code_point >> 12U) & 0x3FU));
    out += static_cast<char>(0x80U | ((code_point >> 6U) & 0x3FU));
    out += static_cast<char>(0x80U | (code_point & 0x3FU));
  }
}

bool is_whitespace(std::uint32_t c) {
  return (c >= 0x09U && c <= 0x0DU) || c == 0x20U || c == 0x85U || c == 0xA0U || c == 0x1680U ||
         (c >= 0x2000U && c <= 0x200AU) || c == 0x2028U || c == 0x2029U || c == 0x202FU || c == 0x205FU || c == 0x3000U;
}

bool is_word_character(std::uint32_t c) {
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC: return true;
    default: break;
  }
  // The joiners (Join_Control), and the symbols that are Alphabetic all the same (Other_Alphabetic):
  // circled, parenthesised and squared Latin letters.
  return c == 0x200CU || c == 0x200DU || (c >= 0x24B6U && c <= 0x24E9U) || (c >= 0x1F130U && c <= 0x1F149U) ||
         (c >= 0x1F150U && c <= 0x1F169U) || (c >= 0x1F170U && c <= 0x1F189U);
}

std::string lossy_utf8(std::string_view bytes) {
  std::string out;
  for (std::size_t at = 0; at < bytes.size();) {
    const std::optional<std::size_t> bad = invalid_utf8_at(bytes.substr(at));
    if (!bad) {
      out.append(bytes.substr(at));
      break;
    }
    out.append(bytes.substr(at, *bad));
    at += *bad;
    // The maximal prefix of a valid sequence that the bad byte starts, replaced as one.
    const auto* b = reinterpret_cast<const unsigned char*>(bytes.data());
    std::size_t length = 1;
    const unsigned char lead = b[at];
    std::size_t expected = lead >= 0xF0U && lead <= 0xF4U   ? 4
                           : lead >= 0xE0U && lead <= 0xEFU ? 3
                           : lead >= 0xC2U && lead <= 0xDFU ? 2
                                                            : 1;
    unsigned char low = 0x80, high = 0xBF;
    if (lead == 0xE0U) low = 0xA0;
    if (lead == 0xEDU) high = 0x9F;
    if (lead == 0xF0U) low = 0x90;
    if (lead == 0xF4U) high = 0x8F;
    if (expected > 1 && at + 1 < bytes.size() && b[at + 1] >= low && b[at + 1] <= high) {
      length = 2;
      while (length < expected && at + length < bytes.size() && (b[at + length] & 0xC0U) == 0x80U) ++length;
    }
    out.append("\uFFFD");
    at += length;
  }
  return out;
}

}  // namespace loom::data::detail

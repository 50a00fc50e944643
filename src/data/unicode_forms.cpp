#include "unicode_forms.hpp"

#include "utf8.hpp"

#include <fmt/format.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <stdexcept>

namespace loom::data::detail {
namespace {

std::uint8_t combining_class(std::uint32_t c) {
  return static_cast<std::uint8_t>(utf8proc_get_property(static_cast<utf8proc_int32_t>(c))->combining_class);
}

// The primary composite of a starter and the character after it, if Unicode has one (Hangul's
// syllables too). utf8proc composes a buffer that is decomposed already; a pair composes into one
// character or stays two. UTF8PROC_STABLE leaves out the composites excluded from composition.
std::optional<std::uint32_t> composite_of(std::uint32_t starter, std::uint32_t next) {
  std::array<utf8proc_int32_t, 2> pair{static_cast<utf8proc_int32_t>(starter), static_cast<utf8proc_int32_t>(next)};
  const utf8proc_ssize_t length =
      utf8proc_normalize_utf32(pair.data(), 2, static_cast<utf8proc_option_t>(UTF8PROC_COMPOSE | UTF8PROC_STABLE));
  if (length == 1) return static_cast<std::uint32_t>(pair[0]);
  return std::nullopt;
}

struct decomposed_character {
  std::uint32_t code_point;
  std::uint8_t combining_class;
  int change;
};

// Each character's full decomposition, then each run of non-starters put in canonical order.
std::vector<decomposed_character> decomposed(std::string_view text, bool compatibility) {
  const auto options =
      static_cast<utf8proc_option_t>(UTF8PROC_DECOMPOSE | (compatibility ? UTF8PROC_COMPAT : utf8proc_option_t{}));
  std::vector<decomposed_character> out;
  out.reserve(text.size());
  std::array<utf8proc_int32_t, 32> parts{};  // the longest decomposition (U+FDFA's, compatibility) has 18
  for (std::size_t at = 0; at < text.size();) {
    const auto [c, length] = code_point_at(text, at);
    at += length;
    int last_boundary = 0;
    const utf8proc_ssize_t count =
        utf8proc_decompose_char(static_cast<utf8proc_int32_t>(c), parts.data(),
                                static_cast<utf8proc_ssize_t>(parts.size()), options, &last_boundary);
    if (count < 0 || count > static_cast<utf8proc_ssize_t>(parts.size()))
      throw std::runtime_error(fmt::format("Unicode normalization failed at U+{:04X}", c));
    for (utf8proc_ssize_t k = 0; k < count; ++k) {
      const auto part = static_cast<std::uint32_t>(parts[static_cast<std::size_t>(k)]);
      out.push_back({part, combining_class(part), k == 0 ? 0 : 1});
    }
  }
  // Canonical ordering: a stable sort of each run of non-starters by combining class.
  for (auto run = out.begin(); run != out.end();) {
    if (run->combining_class == 0) {
      ++run;
      continue;
    }
    const auto run_end =
        std::find_if(run, out.end(), [](const decomposed_character& d) { return d.combining_class == 0; });
    std::stable_sort(run, run_end, [](const decomposed_character& a, const decomposed_character& b) {
      return a.combining_class < b.combining_class;
    });
    run = run_end;
  }
  return out;
}

// Canonical composition over the ordered decomposition, in the crate's order of output: a starter
// waits for the characters it may compose with; those that cannot compose with it (blocked by a mark
// of the same or a higher class in between) follow it, in order.
std::vector<changed_character> composed(const std::vector<decomposed_character>& characters) {
  std::vector<changed_character> out;
  out.reserve(characters.size());
  std::optional<changed_character> starter;
  std::vector<changed_character> passed_over;  // marks after the starter that did not compose with it
  std::optional<std::uint8_t> last_class;      // the class of the last of them
  const auto flush = [&] {
    out.push_back(*starter);
    out.insert(out.end(), passed_over.begin(), passed_over.end());
    passed_over.clear();
    last_class.reset();
  };
  for (const decomposed_character& d : characters) {
    const changed_character current{d.code_point, d.change};
    if (!starter) {
      if (d.combining_class != 0)
        out.push_back(current);  // a mark before any starter stands as it is
      else
        starter = current;
      continue;
    }
    const bool blocked = last_class && *last_class >= d.combining_class;
    if (!blocked) {
      if (const auto composite = composite_of(starter->code_point, d.code_point)) {
        starter = changed_character{*composite, starter->change + d.change - 1};
        continue;
      }
    }
    if (d.combining_class == 0) {
      flush();
      starter = current;
    } else {
      passed_over.push_back(current);
      last_class = d.combining_class;
    }
  }
  if (starter) flush();
  return out;
}

}  // namespace

std::optional<unicode_form> unicode_form_named(std::string_view type) {
  if (type == "NFC") return unicode_form::nfc;
  if (type == "NFD") return unicode_form::nfd;
  if (type == "NFKC") return unicode_form::nfkc;
  if (type == "NFKD") return unicode_form::nfkd;
  return std::nullopt;
}

std::vector<changed_character> normalized_characters(unicode_form form, std::string_view text) {
  const bool compatibility = form == unicode_form::nfkc || form == unicode_form::nfkd;
  const std::vector<decomposed_character> characters = decomposed(text, compatibility);
  if (form == unicode_form::nfc || form == unicode_form::nfkc) return composed(characters);
  std::vector<changed_character> out;
  out.reserve(characters.size());
  for (const decomposed_character& d : characters) out.push_back({d.code_point, d.change});
  return out;
}

}  // namespace loom::data::detail

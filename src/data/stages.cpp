#include "stages.hpp"

#include "utf8.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <optional>
#include <span>
#include <type_traits>
#include <unordered_map>
#include <utility>

namespace loom::data::detail {
namespace {

// GPT-2's byte-level map: each byte to a printable character (bytes that print stand for themselves)

struct byte_level_map {
  std::array<std::string, 256> to_char;
  std::unordered_map<std::uint32_t, unsigned char> to_byte;
  byte_level_map() {
    std::uint32_t next = 256;
    for (std::uint32_t b = 0; b < 256; ++b) {
      const bool prints = (b >= 0x21U && b <= 0x7EU) || (b >= 0xA1U && b <= 0xACU) || (b >= 0xAEU && b <= 0xFFU);
      const std::uint32_t c = prints ? b : next++;
      append_utf8(to_char[b], c);
      to_byte[c] = static_cast<unsigned char>(b);
    }
  }
};

const byte_level_map& byte_level() {
  static const byte_level_map map;
  return map;
}

std::string replace_all(std::string_view text, std::string_view from, std::string_view to) {
  std::string out;
  for (std::size_t at = 0;;) {
    const std::size_t found = from.empty() ? std::string_view::npos : text.find(from, at);
    if (found == std::string_view::npos) {
      out.append(text.substr(at));
      return out;
    }
    out.append(text.substr(at, found - at)).append(to);
    at = found + from.size();
  }
}

// The library's alignment rules, each the outcome of NormalizedString::transform for one edit: a
// character that takes another's place takes its span; one inserted takes the span of the character
// before the insertion point (every byte of a character shares one span, so that is the span of the
// whole character).

// `prefix` before the text (not empty): the prefix stands for the first character. An empty prefix
// leaves the first character standing for nothing, at (0, 0), as the library's reinsertion of it does.
void prepend(aligned_text& text, std::string_view prefix) {
  if (prefix.empty()) {
    std::fill_n(text.origins.begin(), code_point_at(text.text, 0).second, byte_span{});
    return;
  }
  text.text.insert(0, prefix);
  text.origins.insert(text.origins.begin(), prefix.size(), text.origins.front());
}

// Each span [begin, end) of `text` that `matches` gives replaced by `content`, which stands for the
// last character it replaces.
void replace_spans(aligned_text& text, const std::vector<std::pair<std::size_t, std::size_t>>& matches,
                   std::string_view content) {
  if (matches.empty()) return;
  aligned_text out;
  out.text.reserve(text.text.size());
  out.origins.reserve(text.origins.size());
  std::size_t at = 0;
  for (const auto& [begin, end] : matches) {
    out.text.append(text.text, at, begin - at);
    out.origins.insert(out.origins.end(), text.origins.begin() + static_cast<std::ptrdiff_t>(at),
                       text.origins.begin() + static_cast<std::ptrdiff_t>(begin));
    out.text.append(content);
    out.origins.insert(out.origins.end(), content.size(), text.origins[end - 1]);
    at = end;
  }
  out.text.append(text.text, at);
  out.origins.insert(out.origins.end(), text.origins.begin() + static_cast<std::ptrdiff_t>(at), text.origins.end());
  text = std::move(out);
}

// The text rewritten character by character, each with its change against the text before (the
// Unicode forms'): read as the library reads such a list, left to right over the text before.
void transform(aligned_text& text, const std::vector<changed_character>& characters) {
  aligned_text out;
  out.text.reserve(text.text.size());
  out.origins.reserve(text.origins.size());
  std::size_t at = 0;  // the next byte of the text before that a character takes the place of
  const auto skip_character = [&] {
    if (at < text.text.size()) at += code_point_at(text.text, at).second;
  };
  for (const auto& [code_point, change] : characters) {
    byte_span origin;
    if (change > 0) {
      if (at > 0) origin = text.origins[at - 1];  // else the library's (0, 0)
    } else {
      if (at < text.origins.size()) origin = text.origins[at];  // past the end only for a list that is not the forms'
      skip_character();
      for (int removed = 0; removed < -change; ++removed) skip_character();
    }
    const std::size_t before = out.text.size();
    append_utf8(out.text, code_point);
    out.origins.insert(out.origins.end(), out.text.size() - before, origin);
  }
  text = std::move(out);
}

// The parts of a range [0, size) that `behavior` keeps, the pattern's matches at `spans`.
void split_range(std::size_t size, const std::vector<std::pair<std::size_t, std::size_t>>& spans,
                 split_behavior behavior, bool invert, std::vector<std::pair<std::size_t, std::size_t>>& kept) {
  // Alternating runs: (begin, end, is_match); with invert, matches and gaps change places.
  struct run {
    std::size_t begin, end;
    bool match;
  };
  std::vector<run> runs;
  std::size_t at = 0;
  for (const auto& [begin, end] : spans) {
    if (begin > at) runs.push_back({at, begin, invert});
    runs.push_back({begin, end, !invert});
    at = end;
  }
  if (at < size) runs.push_back({at, size, invert});

  kept.clear();
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const run& r = runs[i];
    switch (behavior) {
      case split_behavior::removed:
        if (!r.match) kept.emplace_back(r.begin, r.end);
        break;
      case split_behavior::isolated: kept.emplace_back(r.begin, r.end); break;
      case split_behavior::merged_with_previous:
        if (r.match && !kept.empty() && kept.back().second == r.begin)
          kept.back().second = r.end;
        else
          kept.emplace_back(r.begin, r.end);
        break;
      case split_behavior::merged_with_next:
        if (!r.match && i > 0 && runs[i - 1].match && !kept.empty() && kept.back().second == r.begin)
          kept.back().second = r.end;
        else
          kept.emplace_back(r.begin, r.end);
        break;
      case split_behavior::contiguous:
        if (r.match && i > 0 && runs[i - 1].match && !kept.empty() && kept.back().second == r.begin)
          kept.back().second = r.end;
        else
          kept.emplace_back(r.begin, r.end);
        break;
    }
  }
}

// Each piece cut where `matches_of(piece's text)` says, kept as `behavior` says; the text stays.
template <class Matches>
void split(pieces& cut, Matches&& matches_of, split_behavior behavior, bool invert) {
  std::vector<piece> out;
  out.reserve(cut.list.size());
  std::vector<std::pair<std::size_t, std::size_t>> kept;
  for (const piece& p : cut.list) {
    split_range(p.end - p.begin, matches_of(cut.text_of(p)), behavior, invert, kept);
    for (const auto& [begin, end] : kept)
      if (end > begin) out.push_back({p.begin + begin, p.begin + end, p.stretch});
  }
  cut.list = std::move(out);
}

// Each piece rewritten by `write(text, origins, out)`, which appends the new piece to `out`.
template <class Write>
void rewrite(pieces& cut, std::size_t size_hint, Write&& write) {
  aligned_text out;
  out.text.reserve(size_hint);
  out.origins.reserve(size_hint);
  for (piece& p : cut.list) {
    const std::size_t begin = out.text.size();
    write(cut.text_of(p), std::span<const byte_span>(cut.text.origins).subspan(p.begin, p.end - p.begin), out);
    p.begin = begin;
    p.end = out.text.size();
  }
  cut.text = std::move(out);
}

void append(aligned_text& out, std::string_view text, byte_span origin) {
  out.text.append(text);
  out.origins.insert(out.origins.end(), text.size(), origin);
}

// "<0x41>" -> 0x41.
std::optional<unsigned char> byte_token(std::string_view token) {
  if (token.size() != 6 || !token.starts_with("<0x") || token.back() != '>') return std::nullopt;
  unsigned value = 0;
  for (const char c : token.substr(3, 2)) {
    value <<= 4U;
    if (c >= '0' && c <= '9')
      value |= static_cast<unsigned>(c - '0');
    else if (c >= 'A' && c <= 'F')
      value |= static_cast<unsigned>(c - 'A' + 10);
    else if (c >= 'a' && c <= 'f')
      value |= static_cast<unsigned>(c - 'a' + 10);
    else
      return std::nullopt;
  }
  return static_cast<unsigned char>(value);
}

}  // namespace

aligned_text aligned_text::given(std::string_view text, std::size_t at) {
  aligned_text out{std::string(text), {}};
  out.origins.reserve(text.size());
  for (std::size_t begin = 0; begin < text.size();) {
    const std::size_t length = utf8_length(static_cast<unsigned char>(text[begin]));
    for (std::size_t k = 0; k < length; ++k) out.origins.push_back({at + begin, at + begin + length});
    begin += length;
  }
  return out;
}

void pre_tokenize(const pre_tokenizer& stage, pieces& cut) {
  std::visit(
      [&](const auto& s) {
        using stage_type = std::decay_t<decltype(s)>;
        if constexpr (std::is_same_v<stage_type, split_stage>) {
          split(
              cut, [&](std::string_view text) { return s.pattern.matches(text); }, s.behavior, s.invert);
        } else if constexpr (std::is_same_v<stage_type, byte_level_stage>) {
          const bool prefix_missing = s.add_prefix_space && std::ranges::any_of(cut.list, [&](const piece& p) {
                                        return cut.text_of(p)[0] != ' ';
                                      });
          if (prefix_missing) {
            // The space stands for the piece's first character, as a prepended text does.
            rewrite(cut, cut.text.text.size() + cut.list.size(),
                    [](std::string_view text, std::span<const byte_span> origins, aligned_text& out) {
                      if (text[0] != ' ') append(out, " ", origins[0]);
                      out.text.append(text);
                      out.origins.insert(out.origins.end(), origins.begin(), origins.end());
                    });
          }
          if (s.gpt2)
            split(
                cut, [&](std::string_view text) { return s.gpt2->matches(text); }, split_behavior::isolated, false);
          // Each byte becomes its printable character, which stands for what the byte stood for.
          rewrite(cut, cut.text.text.size() * 2,
                  [](std::string_view text, std::span<const byte_span> origins, aligned_text& out) {
                    for (std::size_t i = 0; i < text.size(); ++i)
                      append(out, byte_level().to_char[static_cast<unsigned char>(text[i])], origins[i]);
                  });
        } else {
          // Each space becomes the replacement, which stands for the space; the replacement put before
          // a piece stands for its first character.
          rewrite(cut, cut.text.text.size() + cut.list.size() * s.replacement.size(),
                  [&](std::string_view text, std::span<const byte_span> origins, aligned_text& out) {
                    const bool at_start = origins[0].begin == 0;  // the library's offsets_original().0 == 0
                    const bool prepend_here = s.scheme == metaspace_stage::prepend::always ||
                                              (s.scheme == metaspace_stage::prepend::first && at_start);
                    if (prepend_here && text[0] != ' ' && !text.starts_with(s.replacement))
                      append(out, s.replacement, origins[0]);
                    std::size_t kept = 0;  // the start of the run of bytes that are not spaces
                    const auto keep_until = [&](std::size_t end) {
                      out.text.append(text.substr(kept, end - kept));
                      out.origins.insert(out.origins.end(), origins.begin() + static_cast<std::ptrdiff_t>(kept),
                                         origins.begin() + static_cast<std::ptrdiff_t>(end));
                    };
                    for (std::size_t space = text.find(' '); space != std::string_view::npos;
                         space = text.find(' ', space + 1)) {
                      keep_until(space);
                      append(out, s.replacement, origins[space]);
                      kept = space + 1;
                    }
                    keep_until(text.size());
                  });
          if (s.split) {
            split(
                cut,
                [&](std::string_view text) {
                  std::vector<std::pair<std::size_t, std::size_t>> spans;
                  for (std::size_t at = text.find(s.replacement); at != std::string_view::npos;
                       at = text.find(s.replacement, at + s.replacement.size()))
                    spans.emplace_back(at, at + s.replacement.size());
                  return spans;
                },
                split_behavior::merged_with_next, false);
          }
        }
      },
      stage);
}

void normalize(const std::vector<normalizer>& normalizers, aligned_text& text) {
  for (const normalizer& n : normalizers) {
    if (const auto* prefix = std::get_if<prepend_normalizer>(&n)) {
      if (!text.text.empty()) prepend(text, prefix->prefix);
    } else if (const auto* unicode = std::get_if<unicode_normalizer>(&n)) {
      // ASCII is in every form already.
      if (std::any_of(text.text.begin(), text.text.end(), [](char c) { return static_cast<unsigned char>(c) >= 0x80; }))
        transform(text, normalized_characters(unicode->form, text.text));
    } else {
      const auto& replace = std::get<replace_normalizer>(n);
      replace_spans(text, replace.pattern.matches(text.text), replace.content);
    }
  }
}

std::string normalize(const std::vector<normalizer>& normalizers, std::string_view text) {
  aligned_text aligned = aligned_text::given(text, 0);
  normalize(normalizers, aligned);
  return std::move(aligned.text);
}

void apply_decoder(const decoder& stage, std::vector<std::string>& tokens) {
  std::visit(
      [&](const auto& d) {
        using decoder_type = std::decay_t<decltype(d)>;
        if constexpr (std::is_same_v<decoder_type, replace_decoder>) {
          for (std::string& t : tokens) t = replace_all(t, d.pattern, d.content);
        } else if constexpr (std::is_same_v<decoder_type, byte_fallback_decoder>) {
          std::vector<std::string> out;
          std::string bytes;
          std::size_t byte_count = 0;
          const auto flush = [&] {
            if (byte_count == 0) return;
            if (invalid_utf8_at(bytes)) {
              for (std::size_t k = 0; k < byte_count; ++k) out.emplace_back("\uFFFD");
            } else {
              out.push_back(bytes);
            }
            bytes.clear();
            byte_count = 0;
          };
          for (std::string& t : tokens) {
            if (const auto b = byte_token(t)) {
              bytes += static_cast<char>(*b);
              ++byte_count;
            } else {
              flush();
              out.push_back(std::move(t));
            }
          }
          flush();
          tokens = std::move(out);
        } else if constexpr (std::is_same_v<decoder_type, fuse_decoder>) {
          std::string joined;
          for (const std::string& t : tokens) joined += t;
          tokens = {std::move(joined)};
        } else if constexpr (std::is_same_v<decoder_type, strip_decoder>) {
          for (std::string& t : tokens) {
            std::size_t front = 0, back = 0;
            while (front < d.start && t.compare(front * d.content.size(), d.content.size(), d.content) == 0) ++front;
            t.erase(0, front * d.content.size());
            while (back < d.stop && t.size() >= d.content.size() && t.ends_with(d.content)) {
              t.resize(t.size() - d.content.size());
              ++back;
            }
          }
        } else if constexpr (std::is_same_v<decoder_type, byte_level_decoder>) {
          std::string bytes;
          for (const std::string& t : tokens) {
            std::string mapped;
            bool all_mapped = true;
            for (std::size_t at = 0; at < t.size() && all_mapped;) {
              const auto [c, length] = code_point_at(t, at);
              const auto found = byte_level().to_byte.find(c);
              if (found == byte_level().to_byte.end())
                all_mapped = false;
              else
                mapped += static_cast<char>(found->second);
              at += length;
            }
            bytes += all_mapped ? mapped : t;
          }
          tokens = {lossy_utf8(bytes)};
        } else {
          for (std::size_t i = 0; i < tokens.size(); ++i) {
            std::string t = replace_all(tokens[i], d.replacement, " ");
            if (i == 0 && d.strip_first && t.starts_with(' ')) t.erase(0, 1);
            tokens[i] = std::move(t);
          }
        }
      },
      stage);
}

}  // namespace loom::data::detail

#include "stages.hpp"

#include "utf8.hpp"

#include <array>
#include <optional>
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

// `text` cut by the spans the pattern matches, kept as `behavior` says.
std::vector<piece> split(const piece& whole, const std::vector<std::pair<std::size_t, std::size_t>>& spans,
                         split_behavior behavior, bool invert) {
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
  if (at < whole.text.size()) runs.push_back({at, whole.text.size(), invert});

  std::vector<std::pair<std::size_t, std::size_t>> kept;
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
  std::vector<piece> pieces;
  for (const auto& [begin, end] : kept)
    if (end > begin) pieces.push_back({whole.text.substr(begin, end - begin), whole.at_start && begin == 0});
  return pieces;
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

void pre_tokenize(const pre_tokenizer& stage, std::vector<piece>& pieces) {
  std::vector<piece> out;
  for (piece& p : pieces) {
    std::visit(
        [&](const auto& s) {
          using stage_type = std::decay_t<decltype(s)>;
          if constexpr (std::is_same_v<stage_type, split_stage>) {
            for (piece& part : split(p, s.pattern.matches(p.text), s.behavior, s.invert))
              out.push_back(std::move(part));
          } else if constexpr (std::is_same_v<stage_type, byte_level_stage>) {
            if (s.add_prefix_space && !p.text.starts_with(' ')) p.text.insert(0, 1, ' ');
            std::vector<piece> parts =
                s.gpt2 ? split(p, s.gpt2->matches(p.text), split_behavior::isolated, false) : std::vector<piece>{p};
            for (piece& part : parts) {
              std::string mapped;
              for (const char c : part.text) mapped += byte_level().to_char[static_cast<unsigned char>(c)];
              out.push_back({std::move(mapped), part.at_start});
            }
          } else {
            std::string text = replace_all(p.text, " ", s.replacement);
            const bool prepend = s.scheme == metaspace_stage::prepend::always ||
                                 (s.scheme == metaspace_stage::prepend::first && p.at_start);
            if (prepend && !text.starts_with(s.replacement)) text.insert(0, s.replacement);
            piece replaced{std::move(text), p.at_start};
            if (!s.split) {
              out.push_back(std::move(replaced));
              return;
            }
            std::vector<std::pair<std::size_t, std::size_t>> spans;
            for (std::size_t at = replaced.text.find(s.replacement); at != std::string::npos;
                 at = replaced.text.find(s.replacement, at + s.replacement.size()))
              spans.emplace_back(at, at + s.replacement.size());
            for (piece& part : split(replaced, spans, split_behavior::merged_with_next, false))
              out.push_back(std::move(part));
          }
        },
        stage);
  }
  pieces = std::move(out);
}

std::string normalize(const std::vector<normalizer>& normalizers, std::string text) {
  for (const normalizer& n : normalizers) {
    if (const auto* prepend = std::get_if<prepend_normalizer>(&n)) {
      if (!text.empty()) text.insert(0, prepend->prefix);
    } else if (const auto* unicode = std::get_if<unicode_normalizer>(&n)) {
      text = normalized(unicode->form, text);
    } else {
      const auto& replace = std::get<replace_normalizer>(n);
      std::string out;
      std::size_t at = 0;
      for (const auto& [begin, end] : replace.pattern.matches(text)) {
        out.append(text, at, begin - at).append(replace.content);
        at = end;
      }
      out.append(text, at);
      text = std::move(out);
    }
  }
  return text;
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

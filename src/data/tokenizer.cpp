#include <loom/base/text.hpp>
#include <loom/data/tokenizer.hpp>

#include "bpe.hpp"
#include "regex.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <unordered_map>
#include <utility>
#include <variant>

namespace loom::data {
namespace {

using detail::regex;
using nlohmann::json;

constexpr std::string_view metaspace_default = "\u2581";
// Ids above this are refused: the largest vocabularies (Gemma's) have about 262 000 tokens.
constexpr std::int64_t largest_token_id = (1 << 24) - 1;
// The pattern GPT-2's byte-level pre-tokenizer splits by (use_regex), as the tokenizers library has it.
constexpr std::string_view gpt2_pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

[[noreturn]] void refuse(std::string_view file, std::string_view key, std::string_view what) {
  throw_error<std::invalid_argument>("{}: {} {}", file, key, what);
}

// --- UTF-8

// The offset of the first byte that does not start a well-formed UTF-8 sequence, if any.
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

// The code point at `at` and its length (valid UTF-8).
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

// Rust's char::is_whitespace (Unicode's White_Space), which added tokens' lstrip and rstrip use.
bool is_whitespace(std::uint32_t c) {
  return (c >= 0x09U && c <= 0x0DU) || c == 0x20U || c == 0x85U || c == 0xA0U || c == 0x1680U ||
         (c >= 0x2000U && c <= 0x200AU) || c == 0x2028U || c == 0x2029U || c == 0x202FU || c == 0x205FU || c == 0x3000U;
}

// Invalid UTF-8 as Rust's String::from_utf8_lossy writes it: each maximal bad prefix one U+FFFD.
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

// --- GPT-2's byte-level map: each byte to a printable character (bytes that print stand for themselves)

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

// --- the pipeline's stages

// A piece of text on its way to the model, and whether it starts the text (Metaspace's "first").
struct piece {
  std::string text;
  bool at_start = false;
};

enum class split_behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

struct split_stage {
  regex pattern;
  split_behavior behavior;
  bool invert = false;
};
struct byte_level_stage {
  bool add_prefix_space = false;
  std::optional<regex> gpt2;  // use_regex
};
struct metaspace_stage {
  std::string replacement{metaspace_default};
  enum class prepend { always, first, never } scheme = prepend::always;
  bool split = true;
};
using pre_tokenizer = std::variant<split_stage, byte_level_stage, metaspace_stage>;

struct prepend_normalizer {
  std::string prefix;
};
struct replace_normalizer {
  regex pattern;
  std::string content;
};
using normalizer = std::variant<prepend_normalizer, replace_normalizer>;

struct replace_decoder {
  std::string pattern, content;  // a string pattern (the decoders' Replace takes no regex here)
};
struct byte_fallback_decoder {};
struct fuse_decoder {};
struct strip_decoder {
  std::string content;
  std::size_t start = 0, stop = 0;
};
struct byte_level_decoder {};
struct metaspace_decoder {
  std::string replacement{metaspace_default};
  bool strip_first = true;  // prepend_scheme other than never
};
using decoder = std::variant<replace_decoder, byte_fallback_decoder, fuse_decoder, strip_decoder, byte_level_decoder,
                             metaspace_decoder>;

struct added_token {
  std::string content;
  std::int32_t id = 0;
  bool special = false, lstrip = false, rstrip = false;
};

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

// --- reading tokenizer.json

class reader {
 public:
  explicit reader(std::string file) : file_(std::move(file)) {}

  [[nodiscard]] std::string_view type_of(const json& node, std::string_view key) const {
    if (!node.is_object() || !node.contains("type") || !node["type"].is_string())
      refuse(file_, key, "has no \"type\": the file is not one the tokenizers library writes");
    return node["type"].get_ref<const std::string&>();
  }

  // A whole number in 0..largest, else refused naming the key: a float or a huge number never reaches
  // an integer conversion (nor a table of that many tokens).
  [[nodiscard]] std::int64_t whole_number(const json& value, std::string_view key, std::int64_t largest) const {
    if (!value.is_number_integer() || value.get<std::int64_t>() < 0 || value.get<std::int64_t>() > largest)
      refuse(file_, key, fmt::format("is {}, not a whole number in 0..{}", value.dump(), largest));
    return value.get<std::int64_t>();
  }
  [[nodiscard]] std::int32_t token_id(const json& value, std::string_view key) const {
    return static_cast<std::int32_t>(whole_number(value, key, largest_token_id));
  }

  [[noreturn]] void unsupported(std::string_view key, std::string_view value, std::string_view supported) const {
    refuse(file_, key, fmt::format("is \"{}\", which loom's tokenizer does not read (it reads {})", value, supported));
  }

  [[nodiscard]] const json& list_of(const json& node, const char* member, const std::string& key) const {
    if (!node.contains(member) || !node[member].is_array())
      refuse(file_, key, fmt::format("has no \"{}\" list", member));
    return node[member];
  }

  [[nodiscard]] regex pattern_of(const json& node, std::string_view key) const {
    if (node.contains("Regex")) return regex(node["Regex"].get<std::string>());
    if (node.contains("String")) return regex(node["String"].get<std::string>(), /*literal=*/true);
    refuse(file_, key, "is neither {\"Regex\": ...} nor {\"String\": ...}");
  }

  void normalizers(const json& node, std::string key, std::vector<normalizer>& out) const {
    if (node.is_null()) return;
    const std::string_view type = type_of(node, key);
    if (type == "Sequence") {
      const json& list = list_of(node, "normalizers", key);
      for (std::size_t i = 0; i < list.size(); ++i)
        normalizers(list[i], fmt::format("{}.normalizers[{}]", key, i), out);
    } else if (type == "Prepend") {
      out.emplace_back(prepend_normalizer{node.at("prepend").get<std::string>()});
    } else if (type == "Replace") {
      out.emplace_back(
          replace_normalizer{pattern_of(node.at("pattern"), key + ".pattern"), node.at("content").get<std::string>()});
    } else {
      unsupported(key + ".type", type, "Sequence, Prepend and Replace");
    }
  }

  void pre_tokenizers(const json& node, std::string key, std::vector<pre_tokenizer>& out) const {
    if (node.is_null()) return;
    const std::string_view type = type_of(node, key);
    if (type == "Sequence") {
      const json& list = list_of(node, "pretokenizers", key);
      for (std::size_t i = 0; i < list.size(); ++i)
        pre_tokenizers(list[i], fmt::format("{}.pretokenizers[{}]", key, i), out);
    } else if (type == "Split") {
      static const std::unordered_map<std::string_view, split_behavior> behaviors{
          {"Removed", split_behavior::removed},
          {"Isolated", split_behavior::isolated},
          {"MergedWithPrevious", split_behavior::merged_with_previous},
          {"MergedWithNext", split_behavior::merged_with_next},
          {"Contiguous", split_behavior::contiguous}};
      const std::string behavior = node.at("behavior").get<std::string>();
      const auto found = behaviors.find(behavior);
      if (found == behaviors.end())
        unsupported(key + ".behavior", behavior, "Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous");
      out.emplace_back(
          split_stage{pattern_of(node.at("pattern"), key + ".pattern"), found->second, node.value("invert", false)});
    } else if (type == "ByteLevel") {
      byte_level_stage stage{.add_prefix_space = node.value("add_prefix_space", false), .gpt2 = std::nullopt};
      if (node.value("use_regex", true)) stage.gpt2.emplace(gpt2_pattern);
      out.emplace_back(std::move(stage));
    } else if (type == "Metaspace") {
      out.emplace_back(metaspace_of(node, key));
    } else {
      unsupported(key + ".type", type, "Sequence, Split, ByteLevel and Metaspace");
    }
  }

  [[nodiscard]] metaspace_stage metaspace_of(const json& node, const std::string& key) const {
    metaspace_stage stage;
    stage.replacement = node.value("replacement", std::string(metaspace_default));
    stage.split = node.value("split", true);
    const std::string scheme = node.contains("prepend_scheme")
                                   ? node["prepend_scheme"].get<std::string>()
                                   : (node.value("add_prefix_space", true) ? "always" : "never");
    if (scheme == "always")
      stage.scheme = metaspace_stage::prepend::always;
    else if (scheme == "first")
      stage.scheme = metaspace_stage::prepend::first;
    else if (scheme == "never")
      stage.scheme = metaspace_stage::prepend::never;
    else
      unsupported(key + ".prepend_scheme", scheme, "always, first and never");
    return stage;
  }

  void decoders(const json& node, std::string key, std::vector<decoder>& out) const {
    if (node.is_null()) return;
    const std::string_view type = type_of(node, key);
    if (type == "Sequence") {
      const json& list = list_of(node, "decoders", key);
      for (std::size_t i = 0; i < list.size(); ++i) decoders(list[i], fmt::format("{}.decoders[{}]", key, i), out);
    } else if (type == "Replace") {
      const json& pattern = node.at("pattern");
      if (!pattern.contains("String")) unsupported(key + ".pattern", pattern.dump(), "{\"String\": ...}");
      out.emplace_back(replace_decoder{pattern["String"].get<std::string>(), node.at("content").get<std::string>()});
    } else if (type == "ByteFallback") {
      out.emplace_back(byte_fallback_decoder{});
    } else if (type == "Fuse") {
      out.emplace_back(fuse_decoder{});
    } else if (type == "Strip") {
      const auto count = [&](const char* end) {
        return node.contains(end) ? static_cast<std::size_t>(whole_number(node[end], key + "." + end, 1 << 16)) : 0;
      };
      out.emplace_back(strip_decoder{node.at("content").get<std::string>(), count("start"), count("stop")});
    } else if (type == "ByteLevel") {
      out.emplace_back(byte_level_decoder{});
    } else if (type == "Metaspace") {
      const metaspace_stage stage = metaspace_of(node, key);
      out.emplace_back(metaspace_decoder{stage.replacement, stage.scheme != metaspace_stage::prepend::never});
    } else {
      unsupported(key + ".type", type, "Sequence, Replace, ByteFallback, Fuse, Strip, ByteLevel and Metaspace");
    }
  }

  [[nodiscard]] detail::bpe model(const json& node) const {
    const std::string_view type = type_of(node, "model");
    if (type != "BPE") unsupported("model.type", type, "BPE");
    for (const char* absent : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (node.contains(absent) && !node[absent].is_null() && !node[absent].get<std::string>().empty())
        refuse(file_, fmt::format("model.{}", absent),
               "is set, which loom's tokenizer does not read (it is null in "
               "the BPE files of GPT-2, Llama, Qwen, Mistral and Gemma)");
    }
    if (node.contains("dropout") && !node["dropout"].is_null() && node["dropout"].get<double>() > 0.0)
      refuse(file_, "model.dropout", "is set: BPE dropout is for training a tokenizer's users, not for loom to read");
    std::unordered_map<std::string, std::int32_t> vocab;
    if (!node.at("vocab").is_object())
      refuse(
          file_, "model.vocab",
          fmt::format("is {}, not an object of tokens and their ids", node["vocab"].dump(-1, ' ', true).substr(0, 40)));
    for (const auto& [token, id] : node.at("vocab").items())
      vocab.emplace(token, token_id(id, fmt::format("model.vocab[\"{}\"]", token)));
    std::vector<std::pair<std::string, std::string>> merges;
    for (const json& merge : node.at("merges")) {
      if (merge.is_array()) {
        merges.emplace_back(merge.at(0).get<std::string>(), merge.at(1).get<std::string>());
      } else {
        const std::string& text = merge.get_ref<const std::string&>();
        const std::size_t space = text.find(' ');
        if (space == std::string::npos)
          refuse(file_, fmt::format("model.merges[{}]", merges.size()), fmt::format("'{}' is not two tokens", text));
        merges.emplace_back(text.substr(0, space), text.substr(space + 1));
      }
    }
    detail::bpe_settings settings{.unk = std::nullopt,
                                  .byte_fallback = node.value("byte_fallback", false),
                                  .fuse_unk = node.value("fuse_unk", false),
                                  .ignore_merges = node.value("ignore_merges", false)};
    if (node.contains("unk_token") && node["unk_token"].is_string()) {
      const auto found = vocab.find(node["unk_token"].get<std::string>());
      if (found == vocab.end()) refuse(file_, "model.unk_token", "names a token that model.vocab does not have");
      settings.unk = found->second;
    }
    return detail::bpe(std::move(vocab), merges, settings);
  }

  [[nodiscard]] std::vector<added_token> added_tokens(const json& node) const {
    std::vector<added_token> tokens;
    if (node.is_null()) return tokens;
    for (std::size_t i = 0; i < node.size(); ++i) {
      const json& t = node[i];
      if (t.value("single_word", false))
        refuse(file_, fmt::format("added_tokens[{}].single_word", i), "is true, which loom's tokenizer does not read");
      tokens.push_back({t.at("content").get<std::string>(), token_id(t.at("id"), fmt::format("added_tokens[{}].id", i)),
                        t.value("special", false), t.value("lstrip", false), t.value("rstrip", false)});
      if (tokens.back().content.empty()) refuse(file_, fmt::format("added_tokens[{}].content", i), "is empty");
    }
    return tokens;
  }

 private:
  std::string file_;
};

json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) {
    throw_error<std::invalid_argument>("cannot read {}: {}", path.string(),
                                       std::filesystem::exists(path) ? "it cannot be opened" : "there is no such file");
  }
  try {
    return json::parse(in);
  } catch (const json::exception& error) {  // a parse error, or a number out of range
    throw_error<std::invalid_argument>("{} is not JSON: {}", path.string(), error.what());
  }
}

// tokenizer_config.json's "bos_token" / "eos_token": a string, or {"content": ...}.
std::optional<std::string> named_token(const json& config, const char* key) {
  if (!config.contains(key)) return std::nullopt;
  const json& value = config[key];
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string())
    return value["content"].get<std::string>();
  return std::nullopt;
}

}  // namespace

struct tokenizer::impl {
  std::vector<normalizer> normalizers;
  std::vector<pre_tokenizer> pre_tokenizers;
  std::vector<decoder> decoders;
  detail::bpe model;
  std::vector<added_token> added;
  std::unordered_map<std::int32_t, std::size_t> added_by_id;
  std::array<std::vector<std::size_t>, 256> added_by_first_byte;  // longest first
  std::vector<std::string> token_of_id;
  std::optional<std::int32_t> bos, eos;

  impl(const json& file, const std::string& name)
      : model(reader(name).model(file.at("model"))),
        added(reader(name).added_tokens(file.value("added_tokens", json()))) {
    const reader read(name);
    read.normalizers(file.value("normalizer", json()), "normalizer", normalizers);
    read.pre_tokenizers(file.value("pre_tokenizer", json()), "pre_tokenizer", pre_tokenizers);
    read.decoders(file.value("decoder", json()), "decoder", decoders);
    std::int32_t largest = -1;
    for (const auto& [token, id] : model.vocab()) largest = std::max(largest, id);
    for (const added_token& t : added) largest = std::max(largest, t.id);
    token_of_id.resize(static_cast<std::size_t>(largest + 1));
    for (const auto& [token, id] : model.vocab()) token_of_id[static_cast<std::size_t>(id)] = token;
    for (std::size_t i = 0; i < added.size(); ++i) {
      added_by_id[added[i].id] = i;
      token_of_id[static_cast<std::size_t>(added[i].id)] = added[i].content;
      added_by_first_byte[static_cast<unsigned char>(added[i].content[0])].push_back(i);
    }
    for (auto& bucket : added_by_first_byte)
      std::ranges::sort(bucket, std::greater<>{}, [&](std::size_t i) { return added[i].content.size(); });
  }

  // The leftmost, then longest, added token at or after `from`: its index and span (lstrip and rstrip
  // widen it over whitespace).
  struct found_token {
    std::size_t index, begin, end;
  };
  [[nodiscard]] std::optional<found_token> next_added(std::string_view text, std::size_t from) const {
    for (std::size_t at = from; at < text.size(); ++at) {
      for (const std::size_t i : added_by_first_byte[static_cast<unsigned char>(text[at])]) {
        if (text.compare(at, added[i].content.size(), added[i].content) != 0) continue;
        std::size_t begin = at, end = at + added[i].content.size();
        if (added[i].lstrip) {
          while (begin > from) {
            std::size_t lead = begin - 1;
            while (lead > from && (static_cast<unsigned char>(text[lead]) & 0xC0U) == 0x80U) --lead;
            if (!is_whitespace(code_point_at(text, lead).first)) break;
            begin = lead;
          }
        }
        if (added[i].rstrip) {
          while (end < text.size()) {
            const auto [c, length] = code_point_at(text, end);
            if (!is_whitespace(c)) break;
            end += length;
          }
        }
        return found_token{i, begin, end};
      }
    }
    return std::nullopt;
  }

  void encode_text(std::string_view text, bool at_start, std::vector<std::int32_t>& ids) const {
    std::vector<piece> pieces{{normalize(normalizers, std::string(text)), at_start}};
    for (const pre_tokenizer& stage : pre_tokenizers) pre_tokenize(stage, pieces);
    for (const piece& p : pieces) model.encode_word(p.text, ids);
  }
};

tokenizer::tokenizer(std::unique_ptr<impl> core) : core_(std::move(core)) {}
tokenizer::tokenizer(tokenizer&&) noexcept = default;
tokenizer& tokenizer::operator=(tokenizer&&) noexcept = default;
tokenizer::~tokenizer() = default;

tokenizer tokenizer::from_file(const std::filesystem::path& tokenizer_json) {
  const json file = read_json(tokenizer_json);
  const std::string name = tokenizer_json.string();
  if (!file.is_object() || !file.contains("model"))
    throw_error<std::invalid_argument>("{} has no \"model\": it is not a tokenizer the tokenizers library wrote", name);
  std::unique_ptr<impl> core;
  try {
    core = std::make_unique<impl>(file, name);
  } catch (const json::exception& error) {  // a key of the wrong type, or missing
    throw_error<std::invalid_argument>("{} is not a tokenizer.json loom's tokenizer can read: {}", name, error.what());
  }
  // Without a tokenizer_config.json: the special tokens that plainly are a BOS or an EOS.
  for (const added_token& t : core->added) {
    if (!t.special) continue;
    if (!core->bos && (t.content == "<s>" || t.content == "<bos>" || t.content == "<|begin_of_text|>"))
      core->bos = t.id;
    if (!core->eos &&
        (t.content == "</s>" || t.content == "<eos>" || t.content == "<|endoftext|>" || t.content == "<|end_of_text|>"))
      core->eos = t.id;
  }
  return tokenizer(std::move(core));
}

tokenizer tokenizer::from_pretrained(const std::filesystem::path& dir) {
  tokenizer loaded = from_file(dir / "tokenizer.json");
  const std::filesystem::path config_path = dir / "tokenizer_config.json";
  if (!std::filesystem::exists(config_path)) return loaded;
  const json config = read_json(config_path);
  const auto id_of = [&](const char* key) -> std::optional<std::int32_t> {
    const std::optional<std::string> name = named_token(config, key);
    if (!name) return std::nullopt;
    const std::optional<std::int32_t> id = loaded.token_to_id(*name);
    if (!id) {
      throw_error<std::invalid_argument>("{}: {} is '{}', which {} does not have", config_path.string(), key, *name,
                                         (dir / "tokenizer.json").string());
    }
    return id;
  };
  if (const auto bos = id_of("bos_token")) loaded.core_->bos = bos;
  if (const auto eos = id_of("eos_token")) loaded.core_->eos = eos;
  return loaded;
}

std::vector<std::int32_t> tokenizer::encode(std::string_view text) const {
  if (const std::optional<std::size_t> bad = invalid_utf8_at(text)) {
    throw_error<std::invalid_argument>(
        "the text is not valid UTF-8 at byte offset {} (byte 0x{:02X}): decode or clean it before tokenizing", *bad,
        static_cast<unsigned char>(text[*bad]));
  }
  std::vector<std::int32_t> ids;
  std::size_t at = 0;
  while (at < text.size()) {
    const auto token = core_->next_added(text, at);
    const std::size_t text_end = token ? token->begin : text.size();
    if (text_end > at) core_->encode_text(text.substr(at, text_end - at), at == 0, ids);
    if (!token) break;
    ids.push_back(core_->added[token->index].id);
    at = token->end;
  }
  return ids;
}

std::string tokenizer::decode(std::span<const std::int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  for (const std::int32_t id : ids) {
    if (id < 0 || static_cast<std::size_t>(id) >= core_->token_of_id.size() ||
        core_->token_of_id[static_cast<std::size_t>(id)].empty()) {
      throw_error<std::invalid_argument>("decode: the id {} is not in the tokenizer's vocabulary (0..{})", id,
                                         core_->token_of_id.size() - 1);
    }
    if (const auto added = core_->added_by_id.find(id);
        skip_special_tokens && added != core_->added_by_id.end() && core_->added[added->second].special)
      continue;
    tokens.push_back(core_->token_of_id[static_cast<std::size_t>(id)]);
  }
  for (const decoder& stage : core_->decoders) apply_decoder(stage, tokens);
  std::string text;
  for (const std::string& t : tokens) text += t;
  return text;
}

std::optional<std::int32_t> tokenizer::token_to_id(std::string_view token) const {
  for (const added_token& t : core_->added)
    if (t.content == token) return t.id;
  const auto& vocab = core_->model.vocab();
  if (const auto found = vocab.find(std::string(token)); found != vocab.end()) return found->second;
  return std::nullopt;
}

std::int64_t tokenizer::vocab_size() const { return static_cast<std::int64_t>(core_->token_of_id.size()); }
std::optional<std::int32_t> tokenizer::bos_token_id() const { return core_->bos; }
std::optional<std::int32_t> tokenizer::eos_token_id() const { return core_->eos; }

}  // namespace loom::data

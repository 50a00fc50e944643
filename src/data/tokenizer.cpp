#include <loom/base/text.hpp>
#include <loom/data/tokenizer.hpp>

#include "bpe.hpp"
#include "regex.hpp"
#include "stages.hpp"
#include "utf8.hpp"

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

using namespace detail;  // the pipeline's parts: regex, the stages, bpe, utf8
using nlohmann::json;

// Ids above this are refused: the largest vocabularies (Gemma's) have about 262 000 tokens.
constexpr std::int64_t largest_token_id = (1 << 24) - 1;

[[noreturn]] void refuse(std::string_view file, std::string_view key, std::string_view what) {
  throw_error<std::invalid_argument>("{}: {} {}", file, key, what);
}

struct added_token {
  std::string content;
  std::int32_t id = 0;
  bool special = false, lstrip = false, rstrip = false, single_word = false;
  // Matched in the text as the normalizer leaves it (content normalized too), not as given: what
  // tokenizer.add_tokens writes, the library's default for a token that is not special.
  bool normalized = false;
};

// A ByteLevel (or RobertaProcessing) post-processor's trim_offsets: each token's offsets narrowed past
// the spaces at its ends, which the library does even when no special tokens are added.
struct offset_trim {
  bool add_prefix_space = false;  // then a first token's one leading space is the one the pre-tokenizer added
};

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
    } else if (const auto form = unicode_form_named(type)) {
      out.emplace_back(unicode_normalizer{*form});
    } else {
      unsupported(key + ".type", type, "Sequence, Prepend, Replace, NFC, NFD, NFKC and NFKD");
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

  // The post-processor's offset trimming, where it has any: the special tokens it adds are the
  // caller's (encode is add_special_tokens=False), so the other types are let be.
  void post_processors(const json& node, std::string key, std::vector<offset_trim>& out) const {
    if (node.is_null()) return;
    const std::string_view type = type_of(node, key);
    if (type == "Sequence") {
      const json& list = list_of(node, "processors", key);
      for (std::size_t i = 0; i < list.size(); ++i)
        post_processors(list[i], fmt::format("{}.processors[{}]", key, i), out);
    } else if ((type == "ByteLevel" || type == "RobertaProcessing") && node.value("trim_offsets", true)) {
      out.push_back({.add_prefix_space = node.value("add_prefix_space", true)});
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
      const bool special = t.value("special", false);
      tokens.push_back({t.at("content").get<std::string>(), token_id(t.at("id"), fmt::format("added_tokens[{}].id", i)),
                        special, t.value("lstrip", false), t.value("rstrip", false), t.value("single_word", false),
                        t.value("normalized", !special)});
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
  std::vector<offset_trim> trims;
  detail::bpe model;
  std::vector<added_token> added;
  std::unordered_map<std::int32_t, std::size_t> added_by_id;
  // The added tokens as the text is searched for them, the library's two passes: those matched in the
  // text as given, then, in the normalized text between them, the normalized ones (by their
  // normalized content). Each indexed by its first byte, longest first.
  struct added_matcher {
    std::vector<std::string> patterns;  // by index into `added`; empty for the other pass's tokens
    std::array<std::vector<std::size_t>, 256> by_first_byte;
  };
  added_matcher as_given, as_normalized;
  std::vector<std::string> token_of_id;
  // The model's own name of each id (its vocabulary's key), which an added token's content may have
  // taken in token_of_id: what trim_offsets reads of a token the model gave.
  std::vector<std::string_view> model_token_of_id;
  std::optional<std::int32_t> bos, eos;

  impl(const json& file, const std::string& name)
      : model(reader(name).model(file.at("model"))),
        added(reader(name).added_tokens(file.value("added_tokens", json()))) {
    const reader read(name);
    read.normalizers(file.value("normalizer", json()), "normalizer", normalizers);
    read.pre_tokenizers(file.value("pre_tokenizer", json()), "pre_tokenizer", pre_tokenizers);
    read.decoders(file.value("decoder", json()), "decoder", decoders);
    read.post_processors(file.value("post_processor", json()), "post_processor", trims);
    std::int32_t largest = -1;
    for (const auto& [token, id] : model.vocab()) largest = std::max(largest, id);
    for (const added_token& t : added) largest = std::max(largest, t.id);
    token_of_id.resize(static_cast<std::size_t>(largest + 1));
    model_token_of_id.resize(token_of_id.size());
    for (const auto& [token, id] : model.vocab()) {
      token_of_id[static_cast<std::size_t>(id)] = token;
      model_token_of_id[static_cast<std::size_t>(id)] = token;
    }
    as_given.patterns.resize(added.size());
    as_normalized.patterns.resize(added.size());
    for (std::size_t i = 0; i < added.size(); ++i) {
      added_by_id[added[i].id] = i;
      token_of_id[static_cast<std::size_t>(added[i].id)] = added[i].content;
      added_matcher& pass = added[i].normalized ? as_normalized : as_given;
      std::string pattern =
          added[i].normalized ? normalize(normalizers, std::string_view(added[i].content)) : added[i].content;
      if (pattern.empty()) continue;  // a token the normalizer removes whole can match nothing
      // The library names (and so decodes) a normalized token by what it matches: Llama 2's "café" is "▁café".
      token_of_id[static_cast<std::size_t>(added[i].id)] = pattern;
      pass.by_first_byte[static_cast<unsigned char>(pattern[0])].push_back(i);
      pass.patterns[i] = std::move(pattern);
    }
    for (added_matcher* pass : {&as_given, &as_normalized}) {
      for (auto& bucket : pass->by_first_byte)
        std::ranges::sort(bucket, std::greater<>{}, [&](std::size_t i) { return pass->patterns[i].size(); });
    }
  }

  // Whether the text has no word character right before `begin` and right after `end`: where a
  // single_word added token may stand.
  [[nodiscard]] static bool stands_alone(std::string_view text, std::size_t begin, std::size_t end) {
    if (begin > 0) {
      std::size_t lead = begin - 1;
      while (lead > 0 && (static_cast<unsigned char>(text[lead]) & 0xC0U) == 0x80U) --lead;
      if (is_word_character(code_point_at(text, lead).first)) return false;
    }
    return end == text.size() || !is_word_character(code_point_at(text, end).first);
  }

  // The leftmost, then longest, added token at or after `from`: its index and span (lstrip and rstrip
  // widen it over whitespace). A single_word token inside a word is passed over whole, as the
  // library's matcher passes over it: no added token starts within it.
  struct found_token {
    std::size_t index, begin, end;
  };
  [[nodiscard]] std::optional<found_token> next_added(const added_matcher& pass, std::string_view text,
                                                      std::size_t from) const {
    for (std::size_t at = from; at < text.size(); ++at) {
      for (const std::size_t i : pass.by_first_byte[static_cast<unsigned char>(text[at])]) {
        const std::string& pattern = pass.patterns[i];
        if (text.compare(at, pattern.size(), pattern) != 0) continue;
        std::size_t begin = at, end = at + pattern.size();
        if (added[i].single_word && !stands_alone(text, begin, end)) {
          at = end - 1;
          break;
        }
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

  // `text` split at the added tokens `pass` finds: each stretch [begin, end) between them handed to
  // `between`, each token to `token`, in order.
  template <class Between, class Token>
  void split_at_added(const added_matcher& pass, std::string_view text, Between&& between, Token&& token) const {
    std::size_t at = 0;
    while (at < text.size()) {
      const auto found = next_added(pass, text, at);
      const std::size_t text_end = found ? found->begin : text.size();
      if (text_end > at) between(at, text_end);
      if (!found) break;
      token(*found);
      at = found->end;
    }
  }

  // The encoding of one text as it is built: each token's id and span of the text, narrowed as the
  // post-processor's trim_offsets narrows it.
  struct encoding_builder {
    const impl& core;
    std::string_view text;
    encoding out;

    // `value`: the token as the library's encoding names it (its vocabulary entry, or for an added
    // token the text it matched, the whitespace lstrip and rstrip took in included), whose spaces at
    // either end trim_offsets takes off the span.
    void add(std::int32_t id, byte_span span, std::string_view value) {
      for (const offset_trim& trim : core.trims) span = trimmed(trim, span, value);
      out.ids.push_back(id);
      out.offsets.emplace_back(span.begin, span.end);
    }

    // The library counts in characters of the text: so does this, a character at a time.
    [[nodiscard]] byte_span trimmed(const offset_trim& trim, byte_span span, std::string_view value) const {
      const auto is_space = [](std::uint32_t c) { return c == byte_level_space || is_whitespace(c); };
      std::size_t leading = 0, trailing = 0;  // spaces at the token's start, and at its end
      bool all_spaces = true;
      for (std::size_t at = 0; at < value.size();) {
        const auto [c, length] = code_point_at(value, at);
        const bool space = is_space(c);
        if (space && all_spaces) ++leading;
        all_spaces = all_spaces && space;
        trailing = space ? trailing + 1 : 0;
        at += length;
      }
      if (leading > 0) {
        const bool first = out.ids.empty() || span.begin == 0;
        // The one space the pre-tokenizer put before the first word was not in the text: nothing to take off.
        if (!(first && trim.add_prefix_space && leading == 1)) {
          std::size_t begin = span.begin;
          for (std::size_t k = 0; k < leading && begin < text.size(); ++k) begin += code_point_at(text, begin).second;
          span.begin = std::min(begin, span.end);
        }
      }
      if (trailing > 0) {
        std::size_t end = span.end, stepped = 0;
        for (; stepped < trailing && end > 0; ++stepped) {
          --end;
          while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0U) == 0x80U) --end;
        }
        if (stepped == trailing) span.end = std::max(end, span.begin);  // else the span starts too soon to lose them
      }
      return span;
    }
  };
  // GPT-2's byte-level character for the space byte, "Ġ".
  static constexpr std::uint32_t byte_level_space = 0x120;

  // Stretch [begin, end) of the text, between the tokens matched as given: normalized, searched for
  // the normalized added tokens, the rest pre-tokenized and encoded by the model, each token's span
  // the span of the given text its normalized bytes stand for.
  void encode_stretch(encoding_builder& encoding, std::size_t begin, std::size_t end) const {
    pieces cut{aligned_text::given(encoding.text.substr(begin, end - begin), begin), {}};
    normalize(normalizers, cut.text);
    // The normalized added tokens, each with its span and text (taken before the pre-tokenizers
    // rewrite the text); piece k of the normalized text is the stretch before token k.
    struct matched {
      std::int32_t id;
      byte_span span;
      std::string value;
    };
    std::vector<matched> tokens;
    split_at_added(
        as_normalized, cut.text.text,
        [&](std::size_t stretch_begin, std::size_t stretch_end) {
          cut.list.push_back({stretch_begin, stretch_end, tokens.size()});
        },
        [&](const found_token& token) {
          tokens.push_back({added[token.index].id, cut.text.origin_of(token.begin, token.end),
                            cut.text.text.substr(token.begin, token.end - token.begin)});
        });
    for (const pre_tokenizer& stage : pre_tokenizers) pre_tokenize(stage, cut);
    std::size_t next_token = 0;
    const auto add_tokens_before = [&](std::size_t stretch) {
      for (; next_token < stretch; ++next_token)
        encoding.add(tokens[next_token].id, tokens[next_token].span, tokens[next_token].value);
    };
    word_tokens word;
    for (const piece& p : cut.list) {
      add_tokens_before(p.stretch);
      model.encode_word(cut.text_of(p), word);
      std::size_t token_begin = p.begin;
      for (std::size_t t = 0; t < word.ids.size(); ++t) {
        const std::size_t token_end = p.begin + word.ends[t];
        encoding.add(word.ids[t], cut.text.origin_of(token_begin, token_end),
                     model_token_of_id[static_cast<std::size_t>(word.ids[t])]);
        token_begin = token_end;
      }
    }
    add_tokens_before(tokens.size());
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

std::vector<std::int32_t> tokenizer::encode(std::string_view text) const { return encode_with_offsets(text).ids; }

tokenizer::encoding tokenizer::encode_with_offsets(std::string_view text) const {
  if (const std::optional<std::size_t> bad = invalid_utf8_at(text)) {
    throw_error<std::invalid_argument>(
        "the text is not valid UTF-8 at byte offset {} (byte 0x{:02X}): decode or clean it before tokenizing", *bad,
        static_cast<unsigned char>(text[*bad]));
  }
  impl::encoding_builder built{*core_, text, {}};
  core_->split_at_added(
      core_->as_given, text, [&](std::size_t begin, std::size_t end) { core_->encode_stretch(built, begin, end); },
      [&](const impl::found_token& token) {
        built.add(core_->added[token.index].id, {token.begin, token.end},
                  text.substr(token.begin, token.end - token.begin));
      });
  return std::move(built.out);
}

std::string tokenizer::decode(std::span<const std::int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  for (const std::int32_t id : ids) {
    if (id < 0 || static_cast<std::size_t>(id) >= core_->token_of_id.size() ||
        core_->token_of_id[static_cast<std::size_t>(id)].empty()) {
      throw_error<std::invalid_argument>("decode: the id {} is not in the tokenizer's vocabulary (0..{})", id,
                                         core_->token_of_id.size() - 1);
    }
    const std::string& token = core_->token_of_id[static_cast<std::size_t>(id)];
    const auto added = core_->added_by_id.find(id);
    // The library skips a special token by the name it decodes it by, its normalized content where it
    // is normalized: one the normalizer changes (Llama 2's "▁<s>" for a normalized "<s>") is kept.
    const bool skippable = added != core_->added_by_id.end() && core_->added[added->second].special &&
                           core_->added[added->second].content == token;
    if (skip_special_tokens && skippable) continue;
    tokens.push_back(token);
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

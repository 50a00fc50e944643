// loom::data::tokenizer on small hand-written tokenizer.json files: what it reads, and each refusal's
// sentence (the ids of real layouts are checked against the tokenizers library by tokenizer_vs_hf.py).
#include <loom/data/tokenizer.hpp>

#include "scratch_folder.hpp"

#include <nlohmann/json.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_exception.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace fs = std::filesystem;
using Catch::Matchers::ContainsSubstring;
using Catch::Matchers::MessageMatches;
using nlohmann::json;

namespace {

// A scratch folder that writes JSON files.
class folder : public loom::testing::scratch_folder {
 public:
  void write(const std::string& name, const json& content) const { std::ofstream(path() / name) << content.dump(); }
};

// A byte-level BPE of GPT-2's layout that knows "a", "b", "ab", "Ġ", "Ġa" and "Ġab", merging "Ġa" first.
json byte_level_file() {
  json vocab = json::object();
  std::int32_t id = 0;
  for (const char* token : {"a", "b", "ab", "\xC4\xA0",
                            "\xC4\xA0"
                            "ab",
                            "\xC4\xA0"
                            "a"})
    vocab[token] = id++;
  return {{"version", "1.0"},
          {"added_tokens", {{{"id", 6}, {"content", "<|endoftext|>"}, {"special", true}}}},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model",
           {{"type", "BPE"},
            {"vocab", vocab},
            {"merges",
             {"\xC4\xA0 a",
              "\xC4\xA0"
              "a b",
              "a b"}},
            {"unk_token", nullptr}}}};
}

}  // namespace

TEST_CASE("a byte-level BPE: merges by rank, special tokens in the text, decode back") {
  const folder dir;
  dir.write("tokenizer.json", byte_level_file());
  const auto tokenizer = loom::data::tokenizer::from_pretrained(dir.path());
  CHECK(tokenizer.encode("ab ab") == std::vector<std::int32_t>{2, 4});
  CHECK(tokenizer.encode("ab<|endoftext|>ba") == std::vector<std::int32_t>{2, 6, 1, 0});
  CHECK(tokenizer.decode(std::vector<std::int32_t>{2, 4, 6}) == "ab ab<|endoftext|>");
  CHECK(tokenizer.decode(std::vector<std::int32_t>{2, 4, 6}, /*skip_special_tokens=*/true) == "ab ab");
  CHECK(tokenizer.vocab_size() == 7);
  CHECK(tokenizer.eos_token_id() == 6);  // no tokenizer_config.json: GPT-2's end of text
  CHECK_FALSE(tokenizer.bos_token_id());
  CHECK(tokenizer.token_to_id("ab") == 2);
  CHECK_FALSE(tokenizer.token_to_id("abc"));
}

TEST_CASE("tokenizer_config.json names the BOS and EOS tokens, as a string or an object") {
  const folder dir;
  json file = byte_level_file();
  file["added_tokens"].push_back({{"id", 7}, {"content", "<s>"}, {"special", true}});
  dir.write("tokenizer.json", file);
  dir.write("tokenizer_config.json", {{"bos_token", {{"content", "<s>"}}}, {"eos_token", "ab"}});
  const auto tokenizer = loom::data::tokenizer::from_pretrained(dir.path());
  CHECK(tokenizer.bos_token_id() == 7);
  CHECK(tokenizer.eos_token_id() == 2);
  dir.write("tokenizer_config.json", {{"eos_token", "<|im_end|>"}});
  CHECK_THROWS_MATCHES(loom::data::tokenizer::from_pretrained(dir.path()), std::invalid_argument,
                       MessageMatches(ContainsSubstring("eos_token is '<|im_end|>', which") &&
                                      ContainsSubstring("tokenizer.json does not have")));
}

TEST_CASE("text that is not UTF-8 is refused naming the byte offset") {
  const folder dir;
  dir.write("tokenizer.json", byte_level_file());
  const auto tokenizer = loom::data::tokenizer::from_pretrained(dir.path());
  for (const auto& [text, offset] :
       std::vector<std::pair<std::string, std::string>>{{"ab\xFF"
                                                         "ab",
                                                         "byte offset 2 (byte 0xFF)"},
                                                        {"a\xC3", "byte offset 1 (byte 0xC3)"},           // cut short
                                                        {"aa\xED\xA0\x80", "byte offset 2 (byte 0xED)"},  // a surrogate
                                                        {"\xC0\xAF", "byte offset 0 (byte 0xC0)"}}) {     // overlong
    CAPTURE(offset);
    CHECK_THROWS_MATCHES(tokenizer.encode(text), std::invalid_argument,
                         MessageMatches(ContainsSubstring("the text is not valid UTF-8 at " + offset)));
  }
  CHECK_THROWS_MATCHES(
      tokenizer.decode(std::vector<std::int32_t>{2, 9}), std::invalid_argument,
      MessageMatches(ContainsSubstring("decode: the id 9 is not in the tokenizer's vocabulary (0..6)")));
}

TEST_CASE("what the reader does not read is refused naming the key") {
  const folder dir;
  const auto refused = [&](json file, const std::string& sentence) {
    dir.write("tokenizer.json", file);
    CHECK_THROWS_MATCHES(loom::data::tokenizer::from_pretrained(dir.path()), std::invalid_argument,
                         MessageMatches(ContainsSubstring(sentence)));
  };
  json file = byte_level_file();
  file["model"]["type"] = "WordPiece";
  refused(file, "tokenizer.json: model.type is \"WordPiece\", which loom's tokenizer does not read (it reads BPE)");
  file = byte_level_file();
  file["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "Lowercase"}}}}};
  refused(file, "normalizer.normalizers[1].type is \"Lowercase\", which loom's tokenizer does not read");
  file = byte_level_file();
  file["pre_tokenizer"] = {{"type", "Whitespace"}};
  refused(file, "pre_tokenizer.type is \"Whitespace\"");
  file = byte_level_file();
  file["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(a"}}}, {"behavior", "Isolated"}};
  refused(file, "the pattern '(a' is not a regular expression PCRE2 takes: missing closing parenthesis");
  file = byte_level_file();
  file["model"]["merges"].push_back("a c");
  refused(file, "model.merges[3] needs the token 'c', which model.vocab does not have");
  file = byte_level_file();
  file["model"]["dropout"] = 0.1;
  refused(file, "model.dropout is set");
  refused(json::array(), "tokenizer.json has no \"model\": it is not a tokenizer the tokenizers library wrote");
  file = byte_level_file();
  file["model"]["vocab"] = "a";
  refused(file, "model.vocab is \"a\", not an object of tokens and their ids");
  file = byte_level_file();
  file["model"]["merges"] = 5;
  refused(file, "tokenizer.json is not a tokenizer.json loom's tokenizer can read: [json.exception.type_error");
  std::ofstream(dir.path() / "tokenizer.json") << "{\"model\": ";
  CHECK_THROWS_MATCHES(loom::data::tokenizer::from_pretrained(dir.path()), std::invalid_argument,
                       MessageMatches(ContainsSubstring("tokenizer.json is not JSON")));
  CHECK_THROWS_MATCHES(loom::data::tokenizer::from_pretrained(dir.path() / "absent"), std::invalid_argument,
                       MessageMatches(ContainsSubstring("there is no such file")));
}

TEST_CASE("SentencePiece-style: Prepend and Replace, byte fallback, a fused unknown token") {
  const folder dir;
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    vocab[name] = 3 + b;
  }
  vocab["\xE2\x96\x81"] = 259;
  vocab["h"] = 260;
  vocab["i"] = 261;
  vocab["\xE2\x96\x81h"] = 262;
  vocab["\xE2\x96\x81hi"] = 263;
  dir.write("tokenizer.json",
            {{"added_tokens", {{{"id", 1}, {"content", "<s>"}, {"special", true}}}},
             {"normalizer",
              {{"type", "Sequence"},
               {"normalizers",
                {{{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}},
                 {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}}}}},
             {"pre_tokenizer", nullptr},
             {"decoder",
              {{"type", "Sequence"},
               {"decoders",
                {{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
                 {{"type", "ByteFallback"}},
                 {{"type", "Fuse"}},
                 {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
             {"model",
              {{"type", "BPE"},
               {"vocab", vocab},
               {"merges", {"\xE2\x96\x81 h", "\xE2\x96\x81h i"}},
               {"unk_token", "<unk>"},
               {"byte_fallback", true},
               {"fuse_unk", true}}}});
  const auto tokenizer = loom::data::tokenizer::from_pretrained(dir.path());
  // "hi é": ▁hi ▁ then é's two bytes (0xC3 0xA9) through the fallback.
  const std::vector<std::int32_t> ids = tokenizer.encode("hi \xC3\xA9");
  CHECK(ids == std::vector<std::int32_t>{263, 259, 3 + 0xC3, 3 + 0xA9});
  CHECK(tokenizer.decode(ids) == "hi \xC3\xA9");
  CHECK(tokenizer.decode(std::vector<std::int32_t>{263, 3 + 0xC3}) == "hi\xEF\xBF\xBD");  // a lone byte: U+FFFD
  CHECK(tokenizer.bos_token_id() == 1);
  // Offsets: the "▁" put before the text stands for its first character, so "▁hi" is bytes 0..2; a
  // space's "▁" is the space; é's two byte tokens are each the whole character, bytes 3..5.
  const auto encoded = tokenizer.encode_with_offsets("hi \xC3\xA9");
  CHECK(encoded.ids == ids);
  CHECK(encoded.offsets == std::vector<std::pair<std::size_t, std::size_t>>{{0, 2}, {2, 3}, {3, 5}, {3, 5}});
  // 😀's four bytes, four tokens, each bytes 3..7; the special token its own bytes, and the text after
  // it (a stretch of its own) gets its own "▁", which stands for its first character.
  const auto emoji = tokenizer.encode_with_offsets("hi \xF0\x9F\x98\x80<s>hi");
  CHECK(emoji.ids == std::vector<std::int32_t>{263, 259, 3 + 0xF0, 3 + 0x9F, 3 + 0x98, 3 + 0x80, 1, 263});
  CHECK(emoji.offsets == std::vector<std::pair<std::size_t, std::size_t>>{
                             {0, 2}, {2, 3}, {3, 7}, {3, 7}, {3, 7}, {3, 7}, {7, 10}, {10, 12}});

  // Mistral's layout: Metaspace in place of the normalizers, its "▁" put only before the text's start
  // (prepend_scheme first): the same ids and offsets, but the text after a special token has no "▁".
  json file = json::parse(std::ifstream(dir.path() / "tokenizer.json"));
  file["normalizer"] = nullptr;
  file["pre_tokenizer"] = {
      {"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "first"}, {"split", false}};
  dir.write("tokenizer.json", file);
  const auto metaspace = loom::data::tokenizer::from_pretrained(dir.path());
  CHECK(metaspace.encode_with_offsets("hi \xC3\xA9").offsets ==
        std::vector<std::pair<std::size_t, std::size_t>>{{0, 2}, {2, 3}, {3, 5}, {3, 5}});
  const auto after_special = metaspace.encode_with_offsets("hi<s>hi");
  CHECK(after_special.ids == std::vector<std::int32_t>{263, 1, 260, 261});
  CHECK(after_special.offsets == std::vector<std::pair<std::size_t, std::size_t>>{{0, 2}, {2, 5}, {5, 6}, {6, 7}});
}

namespace {

using offsets = std::vector<std::pair<std::size_t, std::size_t>>;

// encode_with_offsets' offsets of `text`, its ids checked against encode's on the way.
offsets offsets_of(const loom::data::tokenizer& tokenizer, const std::string& text) {
  const auto encoded = tokenizer.encode_with_offsets(text);
  CHECK(encoded.ids == tokenizer.encode(text));
  CHECK(encoded.offsets.size() == encoded.ids.size());
  return encoded.offsets;
}

// The byte-level file with GPT-2's two characters for "é" (bytes 0xC3 0xA9: "Ã", "©") and an added
// token that takes in the whitespace on either side.
json byte_level_file_with_accent() {
  json file = byte_level_file();
  file["model"]["vocab"]["\xC3\x83"] = 7;  // Ã
  file["model"]["vocab"]["\xC2\xA9"] = 8;  // ©
  file["added_tokens"].push_back(
      {{"id", 9}, {"content", "<|eot|>"}, {"special", true}, {"lstrip", true}, {"rstrip", true}});
  return file;
}

}  // namespace

TEST_CASE("offsets, byte-level: a token's bytes of the text; one character's byte tokens share its bytes") {
  const folder dir;
  dir.write("tokenizer.json", byte_level_file_with_accent());
  const auto tokenizer = loom::data::tokenizer::from_pretrained(dir.path());
  // "ab" "Ġab": the space is the second token's.
  CHECK(tokenizer.encode("ab ab") == std::vector<std::int32_t>{2, 4});
  CHECK(offsets_of(tokenizer, "ab ab") == offsets{{0, 2}, {2, 5}});
  // The special token is its own bytes, the text after it starts at byte 15.
  CHECK(tokenizer.encode("ab<|endoftext|>ba") == std::vector<std::int32_t>{2, 6, 1, 0});
  CHECK(offsets_of(tokenizer, "ab<|endoftext|>ba") == offsets{{0, 2}, {2, 15}, {15, 16}, {16, 17}});
  // é is two bytes, two byte-level tokens (Ã ©), each of them the whole character: bytes 1..3.
  CHECK(tokenizer.encode("a\xC3\xA9") == std::vector<std::int32_t>{0, 7, 8});
  CHECK(offsets_of(tokenizer, "a\xC3\xA9") == offsets{{0, 1}, {1, 3}, {1, 3}});
  // lstrip and rstrip: the token takes in the space on either side.
  CHECK(tokenizer.encode("a <|eot|> b") == std::vector<std::int32_t>{0, 9, 1});
  CHECK(offsets_of(tokenizer, "a <|eot|> b") == offsets{{0, 1}, {1, 10}, {10, 11}});
  CHECK(offsets_of(tokenizer, "").empty());
}

TEST_CASE("offsets, byte-level: trim_offsets takes the spaces off a token's ends") {
  const folder dir;
  json file = byte_level_file_with_accent();
  file["post_processor"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}};
  dir.write("tokenizer.json", file);
  const auto tokenizer = loom::data::tokenizer::from_pretrained(dir.path());
  // "Ġab" is bytes 3..5 once its space is off.
  CHECK(offsets_of(tokenizer, "ab ab") == offsets{{0, 2}, {3, 5}});
  // GPT-2's pattern leaves the first of two spaces alone: "Ġ" trimmed to nothing, at its end.
  CHECK(tokenizer.encode("ab  ab") == std::vector<std::int32_t>{2, 3, 4});
  CHECK(offsets_of(tokenizer, "ab  ab") == offsets{{0, 2}, {3, 3}, {4, 6}});
  // The added token's stripped spaces are trimmed off again.
  CHECK(offsets_of(tokenizer, "a <|eot|> b") == offsets{{0, 1}, {2, 9}, {10, 11}});
  // add_prefix_space: the first token's one leading space is the pre-tokenizer's, kept; another
  // token's is taken off, and a first token of spaces alone keeps its start. The BOS a template adds
  // is the caller's.
  file["pre_tokenizer"]["add_prefix_space"] = true;
  const json sequence_a = {{"Sequence", {{"id", "A"}, {"type_id", 0}}}};
  file["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       {{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}},
        {{"type", "TemplateProcessing"},
         {"single", {{{"SpecialToken", {{"id", "<|endoftext|>"}, {"type_id", 0}}}}, sequence_a}},
         {"pair", {sequence_a, {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
         {"special_tokens",
          {{"<|endoftext|>", {{"id", "<|endoftext|>"}, {"ids", {6}}, {"tokens", {"<|endoftext|>"}}}}}}}}}};
  dir.write("tokenizer.json", file);
  const auto prefixed = loom::data::tokenizer::from_pretrained(dir.path());
  CHECK(prefixed.encode("ab ab") == std::vector<std::int32_t>{4, 4});
  CHECK(offsets_of(prefixed, "ab ab") == offsets{{0, 2}, {3, 5}});
  CHECK(prefixed.encode(" ab") == std::vector<std::int32_t>{4});
  CHECK(offsets_of(prefixed, " ab") == offsets{{0, 3}});
  CHECK(prefixed.encode("  ab") == std::vector<std::int32_t>{3, 4});
  CHECK(offsets_of(prefixed, "  ab") == offsets{{0, 0}, {2, 4}});
}

TEST_CASE("offsets through NFC: a composed character is the first character it was composed from") {
  const folder dir;
  json file = byte_level_file_with_accent();
  file["normalizer"] = {{"type", "NFC"}};
  dir.write("tokenizer.json", file);
  const auto tokenizer = loom::data::tokenizer::from_pretrained(dir.path());
  // "e" + U+0301 (bytes 1..3) compose into é: its tokens Ã © stand for the "e" alone, as the
  // library's alignments have it; the accent's bytes are no token's.
  CHECK(tokenizer.encode("e\xCC\x81") == std::vector<std::int32_t>{7, 8});
  CHECK(offsets_of(tokenizer, "e\xCC\x81") == offsets{{0, 1}, {0, 1}});
  CHECK(offsets_of(tokenizer,
                   "ae\xCC\x81"
                   "b") == offsets{{0, 1}, {1, 2}, {1, 2}, {4, 5}});
}

TEST_CASE("byte fallback without every byte token: the unknown token waits for a known character, as the library's") {
  // é falls back to <0xC3> <0xA9>; ü (0xC3 0xBC) has no <0xBC>, so it is the unknown token, which the
  // library adds only when a character of the vocabulary or the word's end comes: é's byte tokens go
  // before it. Each token covers the next bytes of the word in that order (the library's Word
  // offsets), so the unknown token's span runs over é as well.
  const folder dir;
  json file = {{"added_tokens", json::array()},
               {"normalizer", nullptr},
               {"pre_tokenizer", nullptr},
               {"decoder", nullptr},
               {"model",
                {{"type", "BPE"},
                 {"vocab", {{"<unk>", 0}, {"<0xC3>", 1}, {"<0xA9>", 2}, {"a", 3}}},
                 {"merges", json::array()},
                 {"unk_token", "<unk>"},
                 {"byte_fallback", true},
                 {"fuse_unk", true}}}};
  dir.write("tokenizer.json", file);
  const auto fused = loom::data::tokenizer::from_pretrained(dir.path());
  const std::string u_umlaut = "\xC3\xBC", e_acute = "\xC3\xA9";
  CHECK(fused.encode(u_umlaut + e_acute + u_umlaut + "a") == std::vector<std::int32_t>{1, 2, 0, 3});
  CHECK(offsets_of(fused, u_umlaut + e_acute + u_umlaut + "a") == offsets{{0, 2}, {0, 2}, {2, 6}, {6, 7}});
  file["model"]["fuse_unk"] = false;
  dir.write("tokenizer.json", file);
  const auto unfused = loom::data::tokenizer::from_pretrained(dir.path());
  CHECK(unfused.encode(u_umlaut + u_umlaut + e_acute) == std::vector<std::int32_t>{0, 1, 2, 0});
  CHECK(offsets_of(unfused, u_umlaut + u_umlaut + e_acute) == offsets{{0, 2}, {2, 4}, {2, 4}, {4, 6}});
}

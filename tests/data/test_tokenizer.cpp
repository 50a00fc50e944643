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
}

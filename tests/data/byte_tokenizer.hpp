#pragma once
// A tokenizer whose tokens are bytes, for tests that need one without a trained vocabulary: every
// byte its own token by byte fallback, no merges; <unk> 0, </s> 1 (EOS), byte b is b + 2.

#include <loom/data/tokenizer.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

namespace loom::testing {

// Writes the tokenizer's tokenizer.json into `dir` (made if missing) and reads it back.
inline loom::data::tokenizer byte_tokenizer(const std::filesystem::path& dir) {
  nlohmann::json vocab = {{"<unk>", 0}, {"</s>", 1}};
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = b + 2;
  const nlohmann::json file = {
      {"added_tokens", {{{"id", 1}, {"content", "</s>"}, {"special", true}}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}, {"byte_fallback", true}}}};
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << file.dump();
  return loom::data::tokenizer::from_pretrained(dir);
}

}  // namespace loom::testing

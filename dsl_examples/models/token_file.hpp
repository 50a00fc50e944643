#pragma once
// Token files as llm.c writes them (dev/data/data_common.py's write_datafile), and as
// dsl_examples/data/make_tokens.py does: a header of 256 little-endian int32 (a magic number, a
// version, the number of tokens, zeros), then the tokens, uint16 under GPT-2's magic and uint32 under
// Llama 3's. nanoGPT's headerless .bin files are uint16 with nothing to say so: they are refused,
// naming the fix, rather than guessed at.

#include <torch/torch.h>

#include <fmt/format.h>

#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace token_file {

inline constexpr std::int32_t gpt2_magic = 20240520;    // version 1, uint16 tokens
inline constexpr std::int32_t llama3_magic = 20240801;  // version 7, uint32 tokens
inline constexpr std::size_t header_ints = 256;

// The file's tokens as int64, each checked to be below `vocab_size`; throws std::runtime_error in one
// sentence naming the file and what is wrong with it.
inline at::Tensor load(const std::filesystem::path& path, std::int64_t vocab_size) {
  static_assert(std::endian::native == std::endian::little, "token files are little-endian");
  const auto fail = [&](const std::string& problem) -> std::runtime_error {
    return std::runtime_error(fmt::format("token file '{}': {}", path.string(), problem));
  };
  std::ifstream in(path, std::ios::binary);
  if (!in) throw fail("it cannot be read");
  std::array<std::int32_t, header_ints> header{};
  in.read(reinterpret_cast<char*>(header.data()), sizeof header);
  if (in.gcount() != static_cast<std::streamsize>(sizeof header) ||
      (header[0] != gpt2_magic && header[0] != llama3_magic)) {
    throw fail(
        fmt::format("no llm.c header (a first int32 of {} for uint16 tokens or {} for uint32 ones); write it with "
                    "dsl_examples/data/make_tokens.py or llm.c's write_datafile",
                    gpt2_magic, llama3_magic));
  }
  const std::size_t width = header[0] == gpt2_magic ? 2 : 4;
  const std::int64_t count = header[2];
  if (count <= 0) throw fail(fmt::format("its header counts {} tokens: there is nothing to train on", count));
  const std::uintmax_t expected = sizeof header + static_cast<std::uintmax_t>(count) * width;
  const std::uintmax_t size = std::filesystem::file_size(path);
  if (size != expected) {
    throw fail(fmt::format("its header counts {} tokens of {} bytes, {} bytes in all, but the file has {}{}", count,
                           width, expected, size, size < expected ? ": it is truncated" : ""));
  }
  std::vector<char> bytes(static_cast<std::size_t>(count) * width);
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  at::Tensor tokens = torch::empty({count}, torch::kLong);
  std::int64_t* out = tokens.data_ptr<std::int64_t>();
  for (std::int64_t i = 0; i < count; ++i) {
    std::uint32_t id = 0;
    std::memcpy(&id, bytes.data() + static_cast<std::size_t>(i) * width, width);
    if (id >= vocab_size) {
      throw fail(
          fmt::format("token {} is id {}, not below the model's vocab_size {}: the file was made with "
                      "another tokenizer",
                      i, id, vocab_size));
    }
    out[i] = id;
  }
  return tokens;
}

}  // namespace token_file

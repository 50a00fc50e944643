// libFuzzer target: the tokenizer.json reader (src/data/tokenizer.cpp, and stages, bpe, regex, utf8). The input is
// the file; each must be read or refused with std::invalid_argument, nothing else, and a file that is
// read must encode and decode a fixed text of many scripts, special-token look-alikes and whitespace.
#include <loom/data/tokenizer.hpp>

#include <unistd.h>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::filesystem::path file =
      std::filesystem::temp_directory_path() / ("loom-fuzz-tokenizer-" + std::to_string(::getpid()) + ".json");
  std::ofstream(file, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  try {
    const auto tokenizer = loom::data::tokenizer::from_file(file);
    const auto ids = tokenizer.encode(
        "Hello, world! <s> <|endoftext|> \xE2\x96\x81x  \t\n caf\xC3\xA9 cafe\xCC\x81 \xE1\x84\x80\xE1\x85\xA1 "
        "\xE4\xBD\xA0\xE5\xA5\xBD");
    (void)tokenizer.decode(ids);
    (void)tokenizer.decode(ids, /*skip_special_tokens=*/true);
  } catch (const std::invalid_argument&) {
  }
  return 0;
}

// loom::data::tokenizer's encode, timed, for bench/tokenizer_speed:
//   tokenizer-speed DIR TEXT_FILE REPETITIONS   encodes the whole file REPETITIONS times on this thread and
//                                               prints {"impl": "loom", "bytes", "tokens", "seconds": [...]}
#include <loom/data/tokenizer.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <exception>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 4) {
    fmt::print(stderr, "usage: tokenizer-speed DIR TEXT_FILE REPETITIONS\n");
    return 2;
  }
  try {
    const auto tokenizer = loom::data::tokenizer::from_pretrained(argv[1]);
    std::ifstream in(argv[2], std::ios::binary);
    const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    std::vector<double> seconds;
    std::size_t tokens = 0;
    for (int r = 0; r < std::stoi(argv[3]); ++r) {
      const auto start = std::chrono::steady_clock::now();
      tokens = tokenizer.encode(text).size();
      seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    fmt::print("{{\"impl\": \"loom\", \"bytes\": {}, \"tokens\": {}, \"seconds\": [{:.6f}]}}\n", text.size(), tokens,
               fmt::join(seconds, ", "));
  } catch (const std::exception& error) {
    fmt::print(stderr, "tokenizer-speed: {}\n", error.what());
    return 1;
  }
  return 0;
}

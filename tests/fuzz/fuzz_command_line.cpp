// libFuzzer target: loom-run's command line. The input is split at NUL bytes into arguments; each
// input must be parsed or rejected with a usage_error (one sentence), nothing else: no crash, no
// other exception, no read past the input (AddressSanitizer), no undefined behaviour.
#include "options.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> words;
  for (std::size_t start = 0; start <= input.size();) {
    const std::size_t end = std::min(input.find('\0', start), input.size());
    words.emplace_back(input.substr(start, end - start));
    start = end + 1;
  }
  const std::vector<std::string_view> args(words.begin(), words.end());
  try {
    (void)loom::launcher::parse_command_line(args);
  } catch (const loom::launcher::usage_error&) {
  }
  return 0;
}

// libFuzzer target: the launcher's environment as runtime::from_env reads it (RANK, WORLD_SIZE,
// MASTER_ADDR, LOOM_TIMEOUT_S, LOOM_BACKEND, LOOM_DEVICE, ...). The input is NAME=VALUE lines;
// each input must be parsed or rejected with a launch_error naming the variable, nothing else.
#include <loom/runtime/launch_env.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  std::map<std::string, std::string, std::less<>> variables;
  for (std::size_t start = 0; start < input.size();) {
    const std::size_t end = std::min(input.find('\n', start), input.size());
    const std::string_view line = input.substr(start, end - start);
    if (const std::size_t equals = line.find('='); equals != std::string_view::npos) {
      variables[std::string(line.substr(0, equals))] = std::string(line.substr(equals + 1));
    }
    start = end + 1;
  }
  const loom::env_lookup lookup = [&](const char* name) -> std::optional<std::string> {
    const auto found = variables.find(std::string_view(name));
    return found == variables.end() ? std::nullopt : std::optional<std::string>(found->second);
  };
  try {
    (void)loom::parse_launch_env(lookup);
  } catch (const loom::launch_error&) {
  }
  return 0;
}

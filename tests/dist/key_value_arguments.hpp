#pragma once
// The key=value command lines of the dist test programs that a Python driver starts.

#include <map>
#include <stdexcept>
#include <string>

namespace loom::testing {

inline std::map<std::string, std::string> key_value_arguments(int argc, char** argv) {
  std::map<std::string, std::string> arguments;
  for (int i = 1; i < argc; ++i) {
    const std::string item = argv[i];
    const auto equals = item.find('=');
    if (equals == std::string::npos) throw std::invalid_argument("expected key=value, got '" + item + "'");
    arguments[item.substr(0, equals)] = item.substr(equals + 1);
  }
  return arguments;
}

}  // namespace loom::testing

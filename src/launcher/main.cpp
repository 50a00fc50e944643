// loom-run: starts a program once per local rank with torchrun's environment and supervises it.
#include "options.hpp"
#include "supervisor.hpp"

#include <exception>
#include <iostream>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

int main(int argc, char** argv) {
  using namespace loom::launcher;
  const std::vector<std::string_view> args(argv + 1, argv + argc);
  try {
    const auto parsed = parse_command_line(args);
    if (std::holds_alternative<help_requested>(parsed)) {
      std::cout << usage_text();
      return 0;
    }
    if (std::holds_alternative<version_requested>(parsed)) {
      std::cout << "loom-run " << LOOM_VERSION << '\n';
      return 0;
    }
    const auto& options = std::get<launch_options>(parsed);
    for (const std::string& note : options.notes) std::cerr << "loom-run: " << note << '\n';
    return supervise(options);
  } catch (const usage_error& error) {
    std::cerr << error.what() << "\nrun 'loom-run --help' for usage\n";
    return 2;
  } catch (const std::exception& error) {
    std::cerr << "loom-run: " << error.what() << '\n';
    return 1;
  }
}

#pragma once
// The example programs' command lines, on CLI11 (as loom-run's): `--help` prints the usage and
// exits 0; a bad command line is one line naming the flag, then a hint, and exit code 2. A program
// that reads a run file takes `--config FILE` and, after its own flags, the file's overrides in
// dotted form (`--lora.rank=16`, `--strategy fsdp`), which the run-file reader checks key by key.

#include <fmt/core.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace recipes {

inline constexpr int usage_exit_code = 2;

// Parses argv into `app`'s options; the exit code to end with (0 after --help, 2 for a bad command
// line) or nothing when the program goes on. A flag is taken in torchrun's spelling too
// (`--seq_len` for `--seq-len`), where the app has the hyphenated one: a run file's overrides keep
// their underscores (`--train.lr.warmup_steps=10`, `--mixed_precision=...`).
inline std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv) {
  std::vector<std::string> words;  // last first, as CLI11 takes a vector
  for (int i = argc - 1; i > 0; --i) {
    std::string word = argv[i];
    const std::size_t end = std::min(word.find('='), word.size());
    if (word.starts_with("--") && word.find('_') < end) {
      std::string hyphenated = word.substr(0, end);
      std::replace(hyphenated.begin(), hyphenated.end(), '_', '-');
      if (app.get_option_no_throw(hyphenated) != nullptr) word = hyphenated + word.substr(end);
    }
    words.push_back(std::move(word));
  }
  try {
    app.parse(words);
    return std::nullopt;
  } catch (const CLI::CallForHelp&) {
    fmt::print("{}", app.help());
    return 0;
  } catch (const CLI::ParseError& error) {
    fmt::print(stderr, "{}: {}\nrun '{} --help' for usage\n", app.get_name(), error.what(), app.get_name());
    return usage_exit_code;
  }
}

// `--config FILE` and the overrides of a run file: the words CLI11 did not know, as "KEY=VALUE".
struct run_file_arguments {
  std::string config;
  std::vector<std::string> overrides;

  void add_to(CLI::App& app, bool required) {
    app.add_option("--config", config,
                   "a run file (TOML, JSON, or YAML as FastVideo writes it): the plan's stages and the loop's options")
        ->check(CLI::ExistingFile)
        ->required(required);
    app.allow_extras();
    app.callback([this, &app] { collect(app); });  // inside parse: its errors are usage errors
    app.footer(
        "Overrides of the run file come after the flags, in dotted form: --lora.rank=16 --strategy=fsdp "
        "--train.steps=100 (docs/run_files.md lists the keys).");
  }

  // The overrides from `app.remaining()`: `--KEY=VALUE` or `--KEY VALUE`.
  void collect(const CLI::App& app) {
    const std::vector<std::string> words = app.remaining();
    for (std::size_t i = 0; i < words.size(); ++i) {
      const std::string& word = words[i];
      if (!word.starts_with("--") || word.size() == 2) {
        throw CLI::ExtrasError("'" + word + "' is not an override; write --KEY=VALUE, e.g. --lora.rank=16",
                               CLI::ExitCodes::ExtrasError);
      }
      if (word.find('=') != std::string::npos) {
        overrides.push_back(word.substr(2));
      } else if (i + 1 < words.size() && !words[i + 1].starts_with("--")) {
        overrides.push_back(word.substr(2) + "=" + words[++i]);
      } else {
        throw CLI::ExtrasError(word + " needs a value: --KEY=VALUE, e.g. --lora.rank=16", CLI::ExitCodes::ExtrasError);
      }
    }
  }
};

// A recipe's main(): `parse` gives its options or the exit code to end with (--help, a bad command
// line); `run` runs it, and what ends it early is one line naming the program, and exit code 1.
template <class Options>
int run_main(std::string_view program, int argc, char** argv, std::variant<Options, int> (*parse)(int, char**),
             int (*run)(const Options&)) {
  const auto parsed = parse(argc, argv);
  if (const int* exit_code = std::get_if<int>(&parsed)) return *exit_code;
  try {
    return run(std::get<Options>(parsed));
  } catch (const std::exception& error) {
    fmt::print(stderr, "{}: {}\n", program, error.what());
    return 1;
  }
}

}  // namespace recipes

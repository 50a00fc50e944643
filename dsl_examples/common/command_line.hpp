#pragma once
// The example programs' command lines, on CLI11 (as loom-run's): `--help` prints the usage and
// exits 0; a bad command line is one line naming the flag, then a hint, and exit code 2. A program
// that reads a run file takes `--config FILE` and, after its own flags, the file's overrides in
// dotted form (`--lora.rank=16`, `--strategy fsdp`), which the run-file reader checks key by key.

#include <loom/base/spelling.hpp>
#include <loom/dsl/stage_kind.hpp>

#include <fmt/core.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
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

// The app's own flags, as typed: "--seq-len", "--out".
inline std::vector<std::string> flags_of(const CLI::App& app) {
  std::vector<std::string> flags;
  for (const CLI::Option* option : app.get_options()) {
    for (const std::string& name : option->get_lnames()) flags.push_back("--" + name);
  }
  return flags;
}

// `--config FILE` and the overrides of a run file: the words CLI11 did not know, as "KEY=VALUE".
// A word that is no key of a run file but close to one of the program's flags (`--seq-lne`,
// `--steps` for `--steps-pretrain`) is refused as a flag, naming the close ones. A fine-tuning
// recipe also takes the folders its run file would otherwise have to name (add_folders_to), so
// that a run file holds no machine's paths.
struct run_file_arguments {
  std::string config;
  std::vector<std::string> overrides;
  std::string pretrained;  // --pretrained DIR: the override pretrained=DIR
  std::string out;         // --out DIR: the override train.out=DIR

  void add_to(CLI::App& app, bool required) {
    app.add_option("--config", config,
                   "a run file (TOML, JSON, or YAML as FastVideo writes it): the plan's stages and the loop's options")
        ->check(CLI::ExistingFile)
        ->required(required);
    app.allow_extras();
    app.callback([this, &app] {  // inside parse: its errors are usage errors
      collect(app);
      add_folders();
    });
    app.footer(
        "Overrides of the run file come after the flags, in dotted form: --lora.rank=16 --strategy=fsdp "
        "--train.steps=100 (docs/run_files.md lists the keys).");
  }

  // --pretrained DIR and --out DIR, for a recipe whose run file need not name its checkpoint or its
  // run folder.
  void add_folders_to(CLI::App& app, bool with_pretrained = true) {
    if (with_pretrained) {
      app.add_option("--pretrained", pretrained,
                     "the checkpoint's folder (config.json and its weights); in place of the run file's pretrained "
                     "stage")
          ->check(CLI::ExistingDirectory);
    }
    app.add_option("--out", out,
                   "the run folder: checkpoints/, metrics.jsonl, summary.json and what the recipe saves; in place of "
                   "the run file's train.out (a folder holds one run)");
  }

  // The overrides from `app.remaining()`: `--KEY=VALUE` or `--KEY VALUE`.
  void collect(const CLI::App& app) {
    const std::vector<std::string> words = app.remaining();
    const std::vector<std::string> flags = flags_of(app);
    for (std::size_t i = 0; i < words.size(); ++i) {
      const std::string& word = words[i];
      if (!word.starts_with("--") || word.size() == 2) {
        throw CLI::ExtrasError("'" + word + "' is not an override; write --KEY=VALUE, e.g. --lora.rank=16",
                               CLI::ExitCodes::ExtrasError);
      }
      // A run file's keys are dotted, or a stage's name (seeded, strategy, ...), which is no flag's slip.
      const std::string key = word.substr(0, word.find('='));
      const bool stage = loom::plan_position(key.substr(2)) <= static_cast<int>(loom::stage_kind::custom_strategy);
      if (key.find('.') == std::string::npos && !stage) {
        if (const std::string close = loom::did_you_mean(key, flags, ""); !close.empty()) {
          throw CLI::ExtrasError(app.get_name() + " has no flag " + key + close, CLI::ExitCodes::ExtrasError);
        }
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

  // The folder flags as the overrides they stand for, after the others; one given both ways is
  // refused rather than one of them quietly winning.
  void add_folders() {
    for (const auto& [flag, value, key] :
         {std::tuple{"--pretrained", &pretrained, "pretrained"}, std::tuple{"--out", &out, "train.out"}}) {
      if (value->empty()) continue;
      const std::string prefix = std::string(key) + "=";
      for (const std::string& given : overrides) {
        if (given.starts_with(prefix)) {
          throw CLI::ExtrasError(std::string(flag) + " " + *value + " and --" + given + " both name it: give one",
                                 CLI::ExitCodes::ExtrasError);
        }
      }
      overrides.push_back(prefix + *value);
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

#pragma once
// A recipe's run folder: the run file's train.out or --out, else runs/<program> in the current
// folder, and what the recipe will do there, said before anything is built: start a run, go on
// with one, or go on with a finished one to more steps (whose learning rate then follows the longer
// schedule). Everything a recipe writes goes inside it.

#include <loom/checkpoint/manifest.hpp>
#include <loom/train/loop.hpp>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>

namespace recipes {

// The newest complete checkpoint's step in `out`, read from the manifests alone (no collective, no
// cleaning up: another job may own the folder, which loom::train's lock then says).
inline std::optional<std::int64_t> newest_checkpoint_step(const std::filesystem::path& out) {
  namespace fs = std::filesystem;
  std::error_code error;
  std::optional<std::int64_t> newest;
  for (const auto& entry : fs::directory_iterator(out / "checkpoints", error)) {
    if (!fs::exists(entry.path() / "manifest.json", error) || entry.path().has_extension()) continue;
    try {
      const std::int64_t step = loom::read_checkpoint_manifest(entry.path()).step;
      newest = std::max(newest.value_or(step), step);
    } catch (const std::exception&) {
      // A damaged checkpoint is loom::train's to set aside, saying so.
    }
  }
  return newest;
}

// The run folder `options.out`, defaulted to runs/<program>, and one line for rank 0 to say first.
inline std::string choose_run_folder(loom::train_options& options, std::string_view program) {
  if (options.out.empty()) options.out = std::filesystem::path("runs") / program;
  const std::string folder = options.out.string();
  const std::optional<std::int64_t> done = newest_checkpoint_step(options.out);
  if (!done) return fmt::format("{}: a new run in {} (--out DIR for another folder)", program, folder);
  bool finished = false;
  if (std::ifstream summary(options.out / "summary.json"); summary) {
    const nlohmann::json read = nlohmann::json::parse(summary, nullptr, /*allow_exceptions=*/false);
    finished = read.is_object() && read.value("finished", false) && read.value("last_step", std::int64_t{0}) == *done;
  }
  if (*done >= options.steps) {
    return fmt::format(
        "{}: {} holds a run of {} steps already: no step to take, its results written again "
        "(--train.steps=N to go on, --out DIR to start afresh)",
        program, folder, *done);
  }
  if (finished) {
    return fmt::format(
        "{}: {} holds a finished run of {} steps: going on to {} steps, with the learning rate of a "
        "{}-step schedule from step {} (--out DIR to start afresh instead)",
        program, folder, *done, options.steps, options.steps, *done + 1);
  }
  return fmt::format("{}: {} holds this run's checkpoint of step {}: going on to step {}", program, folder, *done,
                     options.steps);
}

}  // namespace recipes

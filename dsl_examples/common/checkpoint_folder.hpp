#pragma once
// The folder of the checkpoint a recipe's plan loads (its pretrained stage): its config.json is the
// model's. Each refusal names the path as the user gave it, and the file loom would read beside it.

#include <loom/config/run_file.hpp>

#include <fmt/format.h>

#include <filesystem>
#include <stdexcept>
#include <string>

namespace recipes {

inline std::filesystem::path checkpoint_folder(const loom::run_file& file, const std::string& config) {
  namespace fs = std::filesystem;
  const auto pretrained = file.stages.stages.find<loom::pretrained_stage>();
  if (!pretrained) {
    throw std::invalid_argument(fmt::format(
        "no checkpoint to fine-tune: give --pretrained DIR (a folder with config.json and its weights), or add "
        "{{ pretrained = \"DIR\" }} to the plan of run file '{}'",
        config));
  }
  const fs::path path = pretrained->path();
  if (fs::is_directory(path)) return path;
  if (!fs::exists(path)) {
    throw std::invalid_argument(fmt::format(
        "--pretrained '{}' does not exist: give a checkpoint's folder (its config.json and its weights, one "
        ".safetensors file or a sharded index)",
        path.string()));
  }
  if (path.filename() == "config.json") {
    throw std::invalid_argument(
        fmt::format("pretrained '{}' is the model's config, not its weights: give the folder that holds both, '{}'",
                    path.string(), path.parent_path().string()));
  }
  if (!fs::exists(path.parent_path() / "config.json")) {
    throw std::invalid_argument(
        fmt::format("pretrained '{}' is a weights file, and its folder '{}' has no config.json to build the model "
                    "from: give a checkpoint's folder that holds both",
                    path.string(), path.parent_path().string()));
  }
  return path.parent_path();
}

}  // namespace recipes

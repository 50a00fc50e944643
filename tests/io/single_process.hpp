#pragma once
// What the single-process tests of the job's files share: a small TinyGpt, the runtime of one
// process, and an empty scratch folder per case.

#include <loom/runtime/runtime.hpp>
#include <models/tiny_gpt.hpp>

#include <filesystem>
#include <string>

namespace loom::testing {

inline constexpr models::tiny_gpt_config small_gpt{.vocab = 32, .d = 16, .layers = 2, .heads = 2, .ctx = 8};

inline runtime one() { return runtime::single_process(); }

// <tmp>/<suite>/<name>, emptied.
inline std::filesystem::path scratch(const std::string& suite, const std::string& name) {
  const std::filesystem::path folder = std::filesystem::temp_directory_path() / suite / name;
  std::filesystem::remove_all(folder);
  return folder;
}

}  // namespace loom::testing

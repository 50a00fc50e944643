#pragma once
// The one runtime a distributed test process joins, started by loom-run, and the folders its ranks share.

#include <loom/runtime/runtime.hpp>

#include <filesystem>
#include <string>
#include <string_view>

namespace loom::testing {

inline runtime& world() {
  static runtime instance = runtime::from_env();
  return instance;
}

// An empty folder that every rank sees, one per program, world size and `name`; a collective.
inline std::filesystem::path shared_scratch(std::string_view program, const std::string& name) {
  const std::filesystem::path folder = std::filesystem::temp_directory_path() / ("loom-dist-" + std::string(program)) /
                                       (std::to_string(world().world_size()) + "-ranks") / name;
  if (world().rank() == 0) std::filesystem::remove_all(folder);
  world().comm().barrier().wait();
  return folder;
}

}  // namespace loom::testing

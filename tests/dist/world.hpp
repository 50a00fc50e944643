#pragma once
// The one runtime a distributed test process joins, started by loom-run, the folders its ranks
// share, and whether they hold the same values.

#include <loom/runtime/runtime.hpp>

#include <ATen/ATen.h>

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

// Whether every rank holds the same `tensor`: its sizes, then its values.
inline bool same_on_every_rank(const at::Tensor& tensor) {
  const int ranks = world().world_size();
  at::Tensor numel = at::full({1}, tensor.numel(), at::kLong);
  at::Tensor numels = at::empty({ranks}, at::kLong);
  world().comm().all_gather(numel, numels).wait();
  if (!at::equal(numels, numels[0].expand({ranks}))) return false;
  at::Tensor gathered = at::empty({tensor.numel() * ranks}, tensor.options());
  world().comm().all_gather(tensor.contiguous().view(-1), gathered).wait();
  const at::Tensor rows = gathered.view({ranks, -1});
  for (int r = 1; r < ranks; ++r) {
    if (!at::equal(rows[r], rows[0])) return false;
  }
  return true;
}

}  // namespace loom::testing

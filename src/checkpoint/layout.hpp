#pragma once
// A checkpoint folder's layout (docs/checkpoints.md), private to src/checkpoint: the step-N folders,
// step-N.tmp while a save writes them, each rank's file and the names of what it holds, the
// manifest's file, and the commit that makes a partial folder a complete checkpoint.

#include <loom/checkpoint/manifest.hpp>
#include <loom/runtime/runtime.hpp>

#include <ATen/core/Generator.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::checkpoint_detail {

inline constexpr const char* manifest_file = "manifest.json";
// What a rank's file holds, by name: the model's tensors under model/, a moving average of the
// trainable ones under ema/ when the run keeps one, the optimizer's archive, and each generator's
// state under rng/; in its metadata, the caller's state of the rank, if any, and
// under tensor_parallel the split tensors' dimensions.
inline constexpr std::string_view model_prefix = "model/";
inline constexpr std::string_view averages_prefix = "ema/";
inline constexpr const char* optimizer_key = "optimizer";
inline constexpr std::string_view rng_prefix = "rng/";
inline constexpr const char* rank_state_key = "rank_state";
// Under tensor_parallel: the dimension each split tensor is cut along, {"name": dim}, in JSON.
inline constexpr const char* split_dims_key = "split_dims";

// The default generators this rank draws from: the CPU's, and its device's when that is a GPU.
[[nodiscard]] std::vector<std::pair<std::string, at::Generator>> generators(const runtime& rt);

// rank-00003.safetensors: the file of rank 3.
[[nodiscard]] std::filesystem::path rank_file(int rank);

// step-00000012 (complete) or step-00000012.tmp (a save in progress, or interrupted)
[[nodiscard]] std::optional<std::int64_t> step_of(const std::filesystem::path& folder, bool temporary);

// The folders of `folder` named as complete checkpoints (step-N), oldest first.
[[nodiscard]] std::vector<std::pair<std::int64_t, std::filesystem::path>> step_folders(
    const std::filesystem::path& folder);

// The manifest, written last into `partial`, which then becomes `final_path`: the checkpoint is
// complete once the rename is on disk. Then all but the newest `keep` checkpoints beside it go.
void commit_checkpoint(const std::filesystem::path& partial, const std::filesystem::path& final_path,
                       const checkpoint_manifest& manifest, int keep);

}  // namespace loom::checkpoint_detail

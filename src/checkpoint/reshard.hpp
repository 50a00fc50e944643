#pragma once
// Resharding (docs/checkpoints.md), private to src/checkpoint: a checkpoint saved in another layout
// (another number of ranks, shard group or tensor_parallel) put together whole from one copy's files,
// tensor by tensor, and each rank's part taken for its own layout, for the model and for the
// optimizer's per-element state.

#include <loom/checkpoint/checkpoint.hpp>
#include <loom/checkpoint/manifest.hpp>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace torch::optim {
class Optimizer;
}

namespace loom::checkpoint_detail {

// Where one whole copy of a saved run's state lies: rank d·tensor_parallel + t holds slice t of
// data-parallel rank d's rows, for d below `shard_group` (1 when the strategy does not shard: every
// data-parallel rank holds the same) and t below `tensor_parallel`.
struct saved_layout {
  int tensor_parallel = 1;
  int shard_group = 1;
  std::map<std::string, std::int64_t> split_dims;  // the dimension each split tensor is cut along

  [[nodiscard]] static saved_layout of(const checkpoint_manifest& manifest, bool strategy_shards);
  // The old ranks whose files make up one whole copy, in rank order.
  [[nodiscard]] std::vector<int> copy_ranks() const;
};

// The dimensions `layouts` split along, as a rank's file records them (split_dims_key), and back;
// checkpoint_error for a record that is not one.
[[nodiscard]] std::string split_dims_text(const std::map<std::string, tensor_layout>& layouts);
[[nodiscard]] std::map<std::string, std::int64_t> split_dims_of(const std::string& text);

// This rank's state from one whole copy's (`old_ranks`, the model's tensors of each of
// saved.copy_ranks() in turn).
[[nodiscard]] tensor_state resharded_model(const checkpoint_target& target, const saved_layout& saved,
                                           const std::vector<tensor_state>& old_ranks);
// The optimizer's state from one whole copy's archives: rank 0's options and per-step fields, and
// this rank's part of each per-element field (laid out as its parameter).
void load_resharded_optimizer(const checkpoint_target& target, const saved_layout& saved,
                              torch::optim::Optimizer& optimizer, const std::vector<tensor_state>& old_ranks,
                              const std::vector<at::Tensor>& old_archives);

}  // namespace loom::checkpoint_detail

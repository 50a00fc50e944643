#pragma once
// The optimizer's state in a rank's file, private to src/checkpoint: LibTorch's archive of it
// (torch::optim::Optimizer::save) held as the bytes of a tensor, serialised now or, for a background
// write, frozen in staged copies first; and the bytes loaded back into the optimizer.

#include <loom/checkpoint/staging.hpp>

#include <ATen/core/Tensor.h>
#include <torch/serialize/archive.h>

#include <optional>

namespace torch::optim {
class Optimizer;
}

namespace loom::checkpoint_detail {

// The archive's bytes as a tensor that owns them, with no copy of its own.
[[nodiscard]] at::Tensor archive_bytes(torch::serialize::OutputArchive& archive);

// The optimizer's archive, serialised now.
[[nodiscard]] at::Tensor optimizer_bytes(torch::optim::Optimizer& optimizer);

// The optimizer's archive of its state as it is now, in tensors its next steps leave alone: its
// states swapped for copies while it saves, then given back. Nothing when a state is of a kind
// copied_state() does not know, whose archive would hold the live tensors.
[[nodiscard]] std::optional<torch::serialize::OutputArchive> frozen_archive(torch::optim::Optimizer& optimizer,
                                                                            host_staging& staging);

// The optimizer's state and options from its archive's bytes.
void load_optimizer(torch::optim::Optimizer& optimizer, const at::Tensor& bytes);

}  // namespace loom::checkpoint_detail

#pragma once
// loom::optim::AdamW: torch::optim::AdamW with the same options, state, results (within float
// rounding) and files, stepped by ATen's fused kernel (at::_fused_adamw_, CPU and CUDA, PyTorch's
// fused=True): one pass over each parameter where torch::optim::AdamW runs nine kernels and makes
// two temporaries a parameter. A drop-in: its state is torch::optim::AdamWParamState, so a
// checkpoint saved by either loads into the other.

#include <torch/optim/adamw.h>

namespace loom::optim {

class AdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;

  torch::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace loom::optim

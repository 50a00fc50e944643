#pragma once
// Mlp: `depth` × Linear(width, width), ReLU between (BENCHMARKS.md's mlp-ddp model).

#include <loom/nn/linear.hpp>

#include <torch/torch.h>

namespace models {

template <class Linear = loom::nn::Linear>
class BasicMlp : public torch::nn::Module {
 public:
  explicit BasicMlp(std::int64_t width = 1024, std::int64_t depth = 6)
      : layers(register_module("layers", torch::nn::ModuleList())) {
    for (std::int64_t i = 0; i < depth; ++i) layers->push_back(Linear(width, width));
  }

  at::Tensor forward(at::Tensor x) {
    for (std::size_t i = 0; i < layers->size(); ++i) {
      x = layers[i]->as<typename Linear::ContainedType>()->forward(x);
      if (i + 1 < layers->size()) x = torch::relu(x);
    }
    return x;
  }

  torch::nn::ModuleList layers;
};

using Mlp = BasicMlp<loom::nn::Linear>;

}  // namespace models

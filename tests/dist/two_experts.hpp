#pragma once
// Two experts of different depths behind a shared embedding, each a loom::nn::Branch, one a pass
// (as Wan 2.2 A14B's): the model of the branches' tests.

#include <loom/nn/branch.hpp>
#include <loom/nn/linear.hpp>
#include <loom/nn/unit.hpp>
#include <loom/train/flow_matching.hpp>

#include <torch/nn/functional/activation.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <memory>

namespace loom::testing {

inline constexpr std::int64_t width = 16;
struct ExpertBlockImpl : torch::nn::Module {
  explicit ExpertBlockImpl(std::int64_t d)
      : up(register_module("up", loom::nn::Linear(d, 2 * d))),
        down(register_module("down", loom::nn::Linear(2 * d, d))) {}
  at::Tensor forward(const at::Tensor& x) { return x + down(up(x).tanh()); }
  loom::nn::Linear up, down;
};
using ExpertBlock = loom::nn::Unit<ExpertBlockImpl>;

// An expert: a chain of units and a head of its own (its parameters outside the units: the
// branch's root under fsdp()).
struct ExpertImpl : torch::nn::Module {
  ExpertImpl(std::int64_t d, int layers)
      : blocks(register_module("blocks", torch::nn::ModuleList())),
        head(register_module("head", loom::nn::Linear(d, d))) {
    for (int i = 0; i < layers; ++i) blocks->push_back(std::make_shared<ExpertBlock>(d));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = x;
    for (const auto& block : *blocks) h = block->as<ExpertBlock>()->forward(h);
    return head(h);
  }
  torch::nn::ModuleList blocks;
  loom::nn::Linear head;
};
using Expert = loom::nn::Branch<ExpertImpl>;

// A shared embedding (the root's), then one of two experts of different depths.
struct TwoExpertsImpl : torch::nn::Module {
  TwoExpertsImpl()
      : embed(register_module("embed", loom::nn::Linear(width, width))),
        high(register_module("high", std::make_shared<Expert>(width, 2))),
        low(register_module("low", std::make_shared<Expert>(width, 3))) {}
  at::Tensor forward(const at::Tensor& x, loom::noise_expert expert) {
    const at::Tensor h = embed(x);
    return expert == loom::noise_expert::high_noise ? high->forward(h) : low->forward(h);
  }
  // The embedding alone: a pass that takes no branch.
  at::Tensor forward(const at::Tensor& x) { return embed(x); }
  // Both experts in one pass: what fsdp() refuses.
  at::Tensor forward(const at::Tensor& x, bool both_experts) {
    const at::Tensor h = embed(x);
    if (!both_experts) return h;
    const at::Tensor first = high->forward(h);
    return first + low->forward(h);
  }
  loom::nn::Linear embed;
  std::shared_ptr<Expert> high, low;
};
TORCH_MODULE(TwoExperts);

}  // namespace loom::testing

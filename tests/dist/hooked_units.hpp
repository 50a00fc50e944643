#pragma once
// A stack of `count` square units between two root layers, with a call in backward at each unit's
// output: a test delays a rank there (the order of the collectives must not depend on it) or samples
// the heap (what a backward holds at each unit).

#include <loom/nn/linear.hpp>
#include <loom/nn/unit.hpp>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include <cstdint>
#include <functional>
#include <memory>

namespace loom::testing {

struct square_block : torch::nn::Module {
  explicit square_block(std::int64_t width) : fc(register_module("fc", loom::nn::Linear(width, width))) {}

  at::Tensor forward(const at::Tensor& x) { return x + at::tanh(fc(x)); }

  loom::nn::Linear fc;
};

struct hooked_units : torch::nn::Module {
  using Block = loom::nn::Unit<square_block>;

  hooked_units(std::int64_t width, int count)
      : in(register_module("in", loom::nn::Linear(width, width))),
        blocks(register_module("blocks", torch::nn::ModuleList())),
        out(register_module("out", loom::nn::Linear(width, width))) {
    for (int i = 0; i < count; ++i) blocks->push_back(std::make_shared<Block>(width));
  }

  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = in(x);
    int unit = 0;
    for (auto& block : *blocks) {
      h = block->as<Block>()->forward(h);
      if (in_backward) h.register_hook([this, unit](const at::Tensor&) { in_backward(unit); });
      ++unit;
    }
    return out(h);
  }

  loom::nn::Linear in;
  torch::nn::ModuleList blocks;
  loom::nn::Linear out;
  // Called in backward as the gradient reaches unit `unit`'s output, before the unit's own backward.
  std::function<void(int unit)> in_backward;
};

}  // namespace loom::testing

#pragma once
// A model whose parameter sizes do not divide by 2 or 3 ranks: 7- and 5-row weights, a 0-d scale,
// a unit that mixes frozen and trainable parameters, and root layers around three units.

#include <loom/nn/linear.hpp>
#include <loom/nn/unit.hpp>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include <memory>

namespace loom::testing {

struct odd_block : torch::nn::Module {
  odd_block()
      : up(register_module("up", loom::nn::Linear(5, 7))),
        down(register_module("down", loom::nn::Linear(7, 5))),
        scale(register_parameter("scale", at::full({}, 0.5))) {
    down->bias.set_requires_grad(false);  // frozen beside trainable parameters in one unit
  }

  // use_up = false leaves `up` (and its adapter) out of this forward: no gradient for it.
  at::Tensor forward(const at::Tensor& x, bool use_up = true) {
    at::Tensor h = use_up ? at::tanh(up(x)) : at::zeros({x.size(0), 7}, x.options());
    return x + down(h) * scale;
  }

  loom::nn::Linear up, down;
  at::Tensor scale;
};

struct odd_units : torch::nn::Module {
  using Block = loom::nn::Unit<odd_block>;

  odd_units()
      : in(register_module("in", loom::nn::Linear(5, 5))),
        blocks(register_module("blocks", torch::nn::ModuleList())),
        out(register_module("out", loom::nn::Linear(5, 3))) {
    for (int i = 0; i < 3; ++i) blocks->push_back(std::make_shared<Block>());
  }

  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = in(x);
    for (auto& block : *blocks) h = block->as<Block>()->forward(h);
    return out(h);
  }

  loom::nn::Linear in;
  torch::nn::ModuleList blocks;
  loom::nn::Linear out;
};

}  // namespace loom::testing

#pragma once
// Residual gated blocks, h + down(silu(gate(h)) · up(h)), where a block may leave its gate out of
// a forward (h + down(up(h))): data-dependent control flow, so the set of parameters that get no
// gradient changes from step to step and from rank to rank. tests/dist/ddp_vs_pytorch.py builds
// the same module in Python, with the same parameter names.

#include <loom/nn/linear.hpp>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include <cstdint>
#include <vector>

namespace loom::testing {

struct gated_block : torch::nn::Module {
  explicit gated_block(std::int64_t width)
      : up(register_module("up", loom::nn::Linear(width, width))),
        gate(register_module("gate", loom::nn::Linear(width, width))),
        down(register_module("down", loom::nn::Linear(width, width))) {}

  at::Tensor forward(const at::Tensor& h, bool use_gate) {
    at::Tensor inner = use_gate ? at::silu(gate(h)) * up(h) : up(h);
    return h + down(inner);
  }

  loom::nn::Linear up, gate, down;
};

struct gated_stack : torch::nn::Module {
  gated_stack(std::int64_t width, std::int64_t depth) : blocks(register_module("blocks", torch::nn::ModuleList())) {
    for (std::int64_t i = 0; i < depth; ++i) blocks->push_back(std::make_shared<gated_block>(width));
  }

  // use_gate[i]: whether block i runs its gate in this forward.
  at::Tensor forward(at::Tensor h, const std::vector<bool>& use_gate) {
    for (std::size_t i = 0; i < blocks->size(); ++i) h = blocks[i]->as<gated_block>()->forward(h, use_gate.at(i));
    return h;
  }

  torch::nn::ModuleList blocks;
};

}  // namespace loom::testing

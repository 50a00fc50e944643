#pragma once
// A trunk every rank uses and a branch that a rank may leave out of its forward: the case of a
// trainable parameter that gets no gradient on some ranks.

#include <loom/nn/linear.hpp>

#include <torch/nn/module.h>

namespace loom::testing {

struct branchy : torch::nn::Module {
  branchy()
      : trunk(register_module("trunk", loom::nn::Linear(8, 8))),
        extra(register_module("extra", loom::nn::Linear(8, 8))) {}

  at::Tensor forward(const at::Tensor& x, bool use_extra) {
    auto h = trunk(x);
    return use_extra ? extra(h) : h;
  }

  loom::nn::Linear trunk, extra;
};

}  // namespace loom::testing

#pragma once
// What fsdp() checks of a model before it shards it, and where each parameter goes (FSDP2's init
// checks): the units (each loom::nn::Unit in the model, in registration order); the group that owns
// each parameter, the innermost unit around it or else the root; no parameter shared by two groups;
// and every sharded parameter owning all of its storage, which fsdp() frees at rest.

#include <loom/nn/unit.hpp>

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace loom::sharding {

inline constexpr std::size_t root_group = 0;  // a parameter outside every unit; unit u is group u + 1

using nn::find_units;
using nn::unit_module;

struct placed_parameter {
  std::string name;
  at::Tensor tensor;
  std::size_t group = root_group;
  bool replicated = false;  // a trainable LoRA adapter: whole on every rank, never sharded
};

// Every parameter of `model`, in registration order, with its group. Throws std::invalid_argument
// naming a parameter that two groups share, or a sharded one that does not own its storage; gives a
// sharded parameter whose storage cannot be resized (loaded from an archive) bytes of its own.
[[nodiscard]] std::vector<placed_parameter> place_parameters(torch::nn::Module& model,
                                                             const std::vector<unit_module>& units);

}  // namespace loom::sharding

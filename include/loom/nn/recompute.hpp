#pragma once
// Activation recomputation for a loom::nn::Unit (torch.utils.checkpoint, which LibTorch's C++ API
// lacks): the unit's forward runs keeping no activations, and its backward runs the forward again
// and differentiates that. The unit calls it; the plan's recompute(...) stage chooses which units.

#include <loom/dsl/recompute.hpp>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <array>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace loom::nn {

// What a forward ran under that its replay in backward must run under again: the default generators'
// states (the CPU's and that of each device an input is on), so that dropout draws the same masks,
// and autocast's settings. run_recomputed keeps them for a unit; CausalLM's chunked loss for its head.
class forward_conditions {
 public:
  // This thread's conditions now, for a forward of `inputs`.
  explicit forward_conditions(const std::vector<at::Tensor>& inputs);
  // Runs `body` with each generator at its saved state, autocast on where it was (in its dtype) and
  // gradients on; then puts each generator back at the state it had.
  void replay(const std::function<void()>& body) const;

 private:
  struct generator_state {
    at::Generator generator;
    at::Tensor state;
  };
  std::vector<generator_state> generators_;
  std::array<std::optional<at::ScalarType>, 2> autocast_;  // the CPU's and CUDA's; none: off
};

// A unit's forward called with its tensor arguments replaced by `inputs`, in order; its outputs.
using replay_forward = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>& inputs)>;

// Runs forward(inputs) with gradients off and returns its outputs, attached to autograd as one node
// whose inputs are `inputs` and `parameters` (the unit's, which the replay reads from the module).
// Its backward runs forward again on detached copies of the inputs, from the generators' states (the
// CPU's and each input device's) and autocast's settings of this call, so dropout draws the same
// masks; then it differentiates the recomputed outputs and hands the gradients of `inputs` and of
// `parameters` to autograd, so a parameter's gradient is accumulated (and DDP's reducer hook fires)
// once, as without recompute. The outputs keep the inputs alive, not the forward's intermediates.
[[nodiscard]] std::vector<at::Tensor> run_recomputed(const replay_forward& forward,
                                                     const std::vector<at::Tensor>& inputs,
                                                     const std::vector<at::Tensor>& parameters);

// Marks the units of `model` that `options` chooses to recompute and returns their names. Throws
// std::invalid_argument, naming the fix, when the model has no loom::nn::Unit or the choice is none.
std::vector<std::string> recompute_units(torch::nn::Module& model, const recompute_options& options);

}  // namespace loom::nn

#pragma once
// A tensor with its dotted name, and its description without values: what the schedule lists, the
// replica check compares, and a module's state is made of.

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace loom {

struct tensor_spec {
  std::string name;
  std::vector<std::int64_t> shape;
  c10::ScalarType dtype = c10::ScalarType::Float;

  [[nodiscard]] std::int64_t numel() const noexcept;
  [[nodiscard]] std::int64_t bytes() const noexcept;
  // "Float[8,8]"
  [[nodiscard]] std::string layout() const;
  // "name Float[8,8]"
  [[nodiscard]] std::string to_string() const;
};

struct named_tensor {
  std::string name;
  at::Tensor tensor;

  [[nodiscard]] tensor_spec spec() const;
};

// How a tensor of a model is held across the ranks of a tensor group: its whole shape, and the
// dimension tensor_parallel cuts it along (each rank holding 1/k of it), or none: whole on each.
struct tensor_layout {
  std::vector<std::int64_t> shape;
  std::optional<std::int64_t> split_dim;
};

// A module's or a strategy's state: named tensors, in a stable order.
using tensor_state = std::vector<named_tensor>;

// A module's state in the order a state dict lists it: parameters, then buffers, registration order.
[[nodiscard]] std::vector<named_tensor> module_state(const torch::nn::Module& module);

// Copies `state` into the module's parameters and buffers of the same names; throws
// std::invalid_argument naming a tensor that is missing, unexpected, or of another shape or dtype.
void load_module_state(torch::nn::Module& module, const std::vector<named_tensor>& state);

}  // namespace loom

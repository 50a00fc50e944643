#include <loom/runtime/tensors.hpp>

#include <torch/nn/module.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace loom {

std::int64_t tensor_spec::numel() const noexcept {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

std::int64_t tensor_spec::bytes() const noexcept {
  return numel() * static_cast<std::int64_t>(c10::elementSize(dtype));
}

std::string tensor_spec::layout() const { return fmt::format("{}[{}]", c10::toString(dtype), fmt::join(shape, ",")); }

std::string tensor_spec::to_string() const { return name + ' ' + layout(); }

tensor_spec named_tensor::spec() const { return {name, tensor.sizes().vec(), tensor.scalar_type()}; }

std::vector<named_tensor> module_state(const torch::nn::Module& module) {
  std::vector<named_tensor> state;
  for (const auto& item : module.named_parameters()) state.push_back({item.key(), item.value()});
  for (const auto& item : module.named_buffers()) state.push_back({item.key(), item.value()});
  return state;
}

}  // namespace loom

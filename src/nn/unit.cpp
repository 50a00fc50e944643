#include <loom/nn/unit.hpp>

#include <loom/base/text.hpp>

#include <c10/util/Type.h>
#include <torch/nn/module.h>

#include <stdexcept>

namespace loom::nn {

std::vector<unit_module> find_units(torch::nn::Module& model) {
  std::vector<unit_module> units;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    if (auto* unit = dynamic_cast<unit_base*>(item.value().get())) units.push_back({item.key(), unit});
  }
  return units;
}

namespace detail {

std::vector<at::Tensor> trainable_parameters(torch::nn::Module& unit) {
  std::vector<at::Tensor> trainable;
  for (const at::Tensor& parameter : unit.parameters()) {
    if (parameter.requires_grad()) trainable.push_back(parameter);
  }
  return trainable;
}

void fail_not_replayable(const std::type_info& block) {
  throw_error<std::invalid_argument>(
      "recompute(): a unit of type loom::nn::Unit<{}> cannot be recomputed: its forward must take tensors, "
      "std::optional tensors, plain values (numbers, enums) or constant inputs (loom/nn/unit.hpp), and return a "
      "tensor or a std::tuple of tensors; "
      "change its signature, or choose other units with recompute({{.every = k}})",
      c10::demangle(block.name()));
}

}  // namespace detail
}  // namespace loom::nn

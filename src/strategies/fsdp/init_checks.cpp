#include <loom/strategies/fsdp/init_checks.hpp>

#include <loom/base/text.hpp>
#include <loom/lora/adapter.hpp>

#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <torch/nn/module.h>

#include <stdexcept>
#include <unordered_map>

namespace loom::sharding {
namespace {

std::string group_name(std::size_t group, const std::vector<unit_module>& units) {
  return group == root_group ? std::string("(root)") : units[group - 1].name;
}

// The innermost unit around `parameter`, else the root.
std::size_t group_of(const std::string& parameter, const std::vector<unit_module>& units) {
  for (std::size_t u = units.size(); u-- > 0;) {
    if (parameter.starts_with(units[u].name + ".")) return u + 1;
  }
  return root_group;
}

// All of its storage, or none (constructed without its bytes).
void require_own_storage(const std::string& name, const at::Tensor& parameter) {
  if (!parameter.is_contiguous() || parameter.storage_offset() != 0 ||
      (parameter.storage().nbytes() != parameter.nbytes() && parameter.storage().nbytes() != 0)) {
    throw_error<std::invalid_argument>(
        "fsdp(): parameter '{}' does not own its storage (a view or a slice of another tensor), so it "
        "cannot be sharded: register it as a tensor of its own",
        name);
  }
  if (!parameter.storage().resizable()) {
    // Loaded from an archive, say: give it bytes of its own (the tensor, and so every handle to it,
    // stays the same), which fsdp can free at rest.
    c10::NoGradGuard no_grad;
    at::Tensor(parameter).set_data(parameter.detach().clone());
  }
}

}  // namespace

std::vector<placed_parameter> place_parameters(torch::nn::Module& model, const std::vector<unit_module>& units) {
  std::vector<placed_parameter> placed;
  std::unordered_map<const c10::TensorImpl*, std::size_t> owner;
  for (const auto& item : model.named_parameters()) {
    const std::string& name = item.key();
    const at::Tensor& parameter = item.value();
    const std::size_t group = group_of(name, units);
    const auto [seen, first] = owner.emplace(parameter.unsafeGetTensorImpl(), group);
    if (!first) {
      throw_error<std::invalid_argument>(
          "fsdp(): parameter '{}' is shared by {} and {}: a unit must own its parameters; tie them inside "
          "one unit, or leave both users in the root",
          name, group_name(seen->second, units), group_name(group, units));
    }
    const bool replicated = parameter.requires_grad() && lora_adapter::is_adapter_parameter(name);
    if (!replicated) require_own_storage(name, parameter);
    placed.push_back({name, parameter, group, replicated});
  }
  return placed;
}

}  // namespace loom::sharding

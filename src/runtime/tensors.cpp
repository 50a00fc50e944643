#include <loom/runtime/tensors.hpp>

#include <loom/base/text.hpp>

#include <torch/nn/module.h>
#include <torch/types.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <stdexcept>
#include <utility>

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

void load_module_state(torch::nn::Module& module, const std::vector<named_tensor>& state) {
  std::map<std::string, const named_tensor*> given;
  for (const named_tensor& t : state) given.emplace(t.name, &t);
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // (module's tensor, state's tensor)
  for (const named_tensor& target : module_state(module)) {
    auto found = given.find(target.name);
    if (found == given.end()) {
      throw_error<std::invalid_argument>(
          "load_state_dict: the state has no tensor '{}', which the module has: it was saved from another "
          "model or plan",
          target.name);
    }
    const tensor_spec want = target.spec();
    const tensor_spec have = found->second->spec();
    if (want.shape != have.shape || want.dtype != have.dtype) {
      throw_error<std::invalid_argument>("load_state_dict: '{}' is {} in the state but {} in the module", target.name,
                                         have.layout(), want.layout());
    }
    copies.emplace_back(target.tensor, found->second->tensor);
    given.erase(found);
  }
  if (!given.empty()) {
    throw_error<std::invalid_argument>(
        "load_state_dict: the state has a tensor '{}' that the module lacks: it was saved from another model "
        "or plan",
        given.begin()->first);
  }
  torch::NoGradGuard no_grad;
  for (auto& [destination, source] : copies) destination.copy_(source);
}

}  // namespace loom

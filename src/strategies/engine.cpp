#include <loom/strategies/engine.hpp>

#include <torch/nn/module.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/types.h>

#include <fmt/format.h>

#include <map>
#include <stdexcept>
#include <utility>
#include <vector>

namespace loom::hooks {

void load_module_state(torch::nn::Module& module, const tensor_state& state) {
  std::map<std::string, const named_tensor*> given;
  for (const named_tensor& t : state) given.emplace(t.name, &t);
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // (module's tensor, state's tensor)
  for (const named_tensor& target : module_state(module)) {
    auto found = given.find(target.name);
    if (found == given.end()) {
      throw std::invalid_argument(fmt::format(
          "loom: load_state_dict: the state has no tensor '{}', which the module has: it was saved from another "
          "model or plan",
          target.name));
    }
    const tensor_spec want = target.spec();
    const tensor_spec have = found->second->spec();
    if (want.shape != have.shape || want.dtype != have.dtype) {
      throw std::invalid_argument(fmt::format("loom: load_state_dict: '{}' is {} in the state but {} in the module",
                                              target.name, have.layout(), want.layout()));
    }
    copies.emplace_back(target.tensor, found->second->tensor);
    given.erase(found);
  }
  if (!given.empty()) {
    throw std::invalid_argument(fmt::format(
        "loom: load_state_dict: the state has a tensor '{}' that the module lacks: it was saved from another model "
        "or plan",
        given.begin()->first));
  }
  torch::NoGradGuard no_grad;
  for (auto& [destination, source] : copies) destination.copy_(source);
}

std::vector<at::Tensor> trainable_tensors(const strategy_context& context) {
  std::vector<at::Tensor> tensors;
  for (const named_tensor& p : context.trainable()) tensors.push_back(p.tensor);
  return tensors;
}

double clip_local_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type) {
  return torch::nn::utils::clip_grad_norm_(parameters, max_norm, norm_type);
}

void require_no_strategy_state(std::string_view engine_name, const tensor_state& state) {
  if (state.empty()) return;
  throw std::invalid_argument(fmt::format(
      "loom: {}() keeps no state of its own, but was given {} tensor(s) starting with '{}': the state was saved "
      "under another strategy",
      engine_name, state.size(), state.front().name));
}

}  // namespace loom::hooks

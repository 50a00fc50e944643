#include <loom/strategies/engine.hpp>

#include <loom/runtime/text.hpp>

#include <torch/nn/module.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/types.h>

#include <fmt/format.h>

#include <stdexcept>
#include <vector>

namespace loom::hooks {

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
  throw_error<std::invalid_argument>(
      "{}() keeps no state of its own, but was given {} tensor(s) starting with '{}': the state was saved "
      "under another strategy",
      engine_name, state.size(), state.front().name);
}

}  // namespace loom::hooks

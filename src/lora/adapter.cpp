#include <loom/lora/adapter.hpp>

#include <torch/nn/functional/dropout.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/init.h>
#include <torch/nn/module.h>

#include <cmath>
#include <string>

namespace loom {

lora_adapter lora_adapter::attach(torch::nn::Module& layer, std::int64_t in_features, std::int64_t out_features,
                                  const lora_adapter_options& options) {
  lora_adapter adapter{options, {}, {}};
  adapter.lora_A = layer.register_parameter(std::string(a_name), torch::empty({options.rank, in_features}));
  adapter.lora_B = layer.register_parameter(std::string(b_name), torch::zeros({out_features, options.rank}));
  torch::nn::init::kaiming_uniform_(adapter.lora_A, std::sqrt(5));
  return adapter;
}

bool lora_adapter::is_adapter_parameter(std::string_view name) noexcept {
  return name.ends_with(a_name) || name.ends_with(b_name);
}

at::Tensor lora_adapter::add_update(at::Tensor output, const at::Tensor& input, bool training) const {
  namespace F = torch::nn::functional;
  const at::Tensor adapter_input =
      dropout > 0 ? F::dropout(input, F::DropoutFuncOptions().p(dropout).training(training)) : input;
  return output.add_(F::linear(F::linear(adapter_input, lora_A), lora_B), scaling);
}

at::Tensor lora_adapter::effective_weight(const at::Tensor& weight) const {
  return at::addmm(weight, lora_B, lora_A, /*beta=*/1, /*alpha=*/scaling);
}

void lora_adapter::merge_into(at::Tensor& weight) const {
  torch::NoGradGuard no_grad;
  weight.add_(lora_B.mm(lora_A), scaling);
}

void lora_adapter::unmerge_from(at::Tensor& weight) const {
  torch::NoGradGuard no_grad;
  weight.sub_(lora_B.mm(lora_A), scaling);
}

}  // namespace loom

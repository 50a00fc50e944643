#include <loom/lora/adapter.hpp>

#include <loom/nn/deferred_init.hpp>
#include <loom/precision/linear.hpp>

#include <torch/nn/functional/dropout.h>
#include <torch/nn/init.h>
#include <torch/nn/module.h>

#include <cmath>
#include <string>

namespace loom {

lora_adapter lora_adapter::attach(torch::nn::Module& layer, std::int64_t in_features, std::int64_t out_features,
                                  const lora_adapter_options& options) {
  lora_adapter adapter{options, {}, {}};
  // fp32 whatever the model was built in (PEFT's autocast_adapter_dtype): they train.
  const auto fp32 = torch::TensorOptions(torch::kFloat);
  adapter.lora_A = layer.register_parameter(std::string(a_name), nn::empty({options.rank, in_features}, fp32));
  adapter.lora_B = layer.register_parameter(std::string(b_name), nn::empty({out_features, options.rank}, fp32));
  nn::initialise(adapter.lora_B, {[](at::Tensor& b) { b.zero_(); }, /*draws=*/false});
  nn::initialise(adapter.lora_A, {[](at::Tensor& a) { torch::nn::init::kaiming_uniform_(a, std::sqrt(5)); }});
  return adapter;
}

bool lora_adapter::is_adapter_parameter(std::string_view name) noexcept {
  return name.ends_with(a_name) || name.ends_with(b_name);
}

at::Tensor lora_adapter::add_update(at::Tensor output, const at::Tensor& input, bool training) const {
  return add_up(std::move(output), down(input, training));
}

at::Tensor lora_adapter::down(const at::Tensor& input, bool training) const {
  namespace F = torch::nn::functional;
  const at::ScalarType type = compute_dtype.value_or(lora_A.scalar_type());
  const at::Tensor adapter_input =
      dropout > 0 ? F::dropout(input, F::DropoutFuncOptions().p(dropout).training(training)) : input;
  return loom::linear(adapter_input.to(type), lora_A.to(type));
}

at::Tensor lora_adapter::add_up(at::Tensor output, const at::Tensor& down) const {
  const at::ScalarType type = compute_dtype.value_or(lora_A.scalar_type());
  // In-place: the update is added to the base output in the output's dtype.
  return output.add_(loom::linear(down, lora_B.to(type)), scaling);
}

at::Tensor lora_adapter::effective_weight(const at::Tensor& weight) const {
  const at::ScalarType type = compute_dtype.value_or(lora_A.scalar_type());
  return at::addmm(weight.to(type), lora_B.to(type), lora_A.to(type), /*beta=*/1, /*alpha=*/scaling)
      .to(weight.scalar_type());
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

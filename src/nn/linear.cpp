#include <loom/nn/linear.hpp>

#include <torch/nn/functional/dropout.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/init.h>

#include <cmath>
#include <stdexcept>

namespace loom::nn {

LinearImpl::LinearImpl(const torch::nn::LinearOptions& options_) : options(options_) { reset(); }

void LinearImpl::reset() {
  // The same registrations and draws, in the same order, as torch::nn::LinearImpl, so that a seeded
  // model built from either has the same weights.
  weight = register_parameter("weight", torch::empty({options.out_features(), options.in_features()}));
  if (options.bias()) {
    bias = register_parameter("bias", torch::empty(options.out_features()));
  } else {
    bias = register_parameter("bias", {}, /*requires_grad=*/false);
  }
  reset_parameters();
}

void LinearImpl::reset_parameters() {
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5));
  if (bias.defined()) {
    auto [fan_in, fan_out] = torch::nn::init::_calculate_fan_in_and_fan_out(weight);
    const double bound = 1 / std::sqrt(static_cast<double>(fan_in));
    torch::nn::init::uniform_(bias, -bound, bound);
  }
}

void LinearImpl::pretty_print(std::ostream& stream) const {
  stream << "loom::nn::Linear(in_features=" << options.in_features()
         << ", out_features=" << options.out_features() << ", bias=" << std::boolalpha << options.bias();
  if (adapter_) stream << ", lora_rank=" << adapter_->rank << ", lora_scaling=" << adapter_->scaling;
  stream << ")";
}

at::Tensor LinearImpl::forward(const at::Tensor& input) {
  at::Tensor output = torch::nn::functional::linear(input, weight, bias);
  if (!adapter_ || merged_) return output;
  at::Tensor adapter_input = input;
  if (adapter_->dropout > 0) {
    adapter_input = torch::nn::functional::dropout(
        input, torch::nn::functional::DropoutFuncOptions().p(adapter_->dropout).training(is_training()));
  }
  at::Tensor update = torch::nn::functional::linear(torch::nn::functional::linear(adapter_input, lora_A), lora_B);
  return output.add_(update, adapter_->scaling);
}

void LinearImpl::add_adapter(const lora_adapter_options& adapter) {
  if (adapter_) throw std::logic_error("loom::nn::Linear already has a LoRA adapter");
  lora_A = register_parameter("lora_A", torch::empty({adapter.rank, options.in_features()}));
  lora_B = register_parameter("lora_B", torch::zeros({options.out_features(), adapter.rank}));
  torch::nn::init::kaiming_uniform_(lora_A, std::sqrt(5));
  adapter_ = adapter;
}

void LinearImpl::merge() {
  if (!adapter_ || merged_) return;
  torch::NoGradGuard no_grad;
  weight.add_(lora_B.mm(lora_A), adapter_->scaling);
  merged_ = true;
}

void LinearImpl::unmerge() {
  if (!adapter_ || !merged_) return;
  torch::NoGradGuard no_grad;
  weight.sub_(lora_B.mm(lora_A), adapter_->scaling);
  merged_ = false;
}

}  // namespace loom::nn

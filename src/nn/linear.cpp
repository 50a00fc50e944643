#include <loom/nn/linear.hpp>

#include <loom/nn/at_rest.hpp>

#include <loom/base/text.hpp>
#include <loom/nn/deferred_init.hpp>
#include <loom/nn/tensor_parallel.hpp>
#include <loom/precision/linear.hpp>

#include <ATen/ATen.h>
#include <torch/nn/init.h>

#include <cmath>
#include <stdexcept>
#include <utility>

namespace loom::nn {

LinearImpl::LinearImpl(const torch::nn::LinearOptions& options_) : options(options_) { reset(); }

void LinearImpl::reset() {
  // The same registrations and draws, in the same order, as torch::nn::LinearImpl, so that a seeded
  // model built from either has the same weights.
  weight = register_parameter("weight", nn::empty({options.out_features(), options.in_features()}));
  if (options.bias()) {
    bias = register_parameter("bias", nn::empty(options.out_features()));
  } else {
    bias = register_parameter("bias", {}, /*requires_grad=*/false);
  }
  reset_parameters();
}

void LinearImpl::reset_parameters() {
  nn::initialise(weight, {[](at::Tensor& w) { torch::nn::init::kaiming_uniform_(w, std::sqrt(5)); }});
  if (bias.defined()) {
    const double bound = 1 / std::sqrt(static_cast<double>(options.in_features()));
    nn::initialise(bias, {[bound](at::Tensor& b) { torch::nn::init::uniform_(b, -bound, bound); }});
  }
}

void LinearImpl::pretty_print(std::ostream& stream) const {
  stream << "loom::nn::Linear(in_features=" << options.in_features() << ", out_features=" << options.out_features()
         << ", bias=" << std::boolalpha << options.bias();
  if (quantized_) stream << ", quantized=" << name_of(quantized_->options().format);
  if (adapter_) stream << ", lora_rank=" << adapter_->rank << ", lora_scaling=" << adapter_->scaling;
  stream << ")";
}

at::Tensor LinearImpl::forward(const at::Tensor& input) {
  // at::linear, as PyTorch's nn.Linear calls it: a batch of rows and the bias in one addmm, rounded
  // once (torch::nn::functional::linear adds the bias after a matmul, a second rounding in bf16);
  // in bf16 on a CPU without bf16 instructions, through the fp32 GEMM (loom/precision/linear.hpp).
  if (split_) return split_forward(input);
  at::Tensor output;
  if (quantized_) {
    output = quant::linear(input, *quantized_, bias);
  } else {
    require_bytes(weight, "loom::nn::Linear");
    output = loom::linear(input, weight, bias);
  }
  if (!adapter_ || (merged_ && !quantized_)) return output;
  return adapter_->add_update(std::move(output), input, is_training());
}

// Colwise: the input enters whole and the output stays split; the adapter's rank-r activation, computed
// whole on every rank, enters B's slice as the input enters the base's. Rowwise: the partial products
// of this rank's input features are summed over the group, then the bias added; the adapter's partial
// rank-r activation is summed before B, which every rank holds whole.
at::Tensor LinearImpl::split_forward(const at::Tensor& input) {
  require_bytes(weight, "loom::nn::Linear");
  const bool update = adapter_ && !merged_;
  const std::size_t base = first_exchange_, adapter = first_exchange_ + 1;
  if (*style_ == parallel_style::colwise) {
    at::Tensor output = loom::linear(split_->enter(input, base), weight, bias);
    if (!update) return output;
    return adapter_->add_up(std::move(output), split_->enter(adapter_->down(input, is_training()), adapter));
  }
  at::Tensor output = split_->reduce(loom::linear(input, weight, {}), base);
  if (bias.defined()) output = output + bias;
  if (!update) return output;
  return adapter_->add_up(std::move(output), split_->reduce(adapter_->down(input, is_training()), adapter));
}

std::optional<parallel_module::cut> LinearImpl::cut_by(parallel_style style) const {
  if (style == parallel_style::colwise) return cut{options.out_features(), "output features"};
  if (style == parallel_style::rowwise) return cut{options.in_features(), "input features"};
  return std::nullopt;
}

std::vector<split_parameter> LinearImpl::split(parallel_style style, std::shared_ptr<tensor_split> split) {
  if (split_) throw std::logic_error("loom::nn::Linear is split already");
  if (quantized_) throw std::logic_error("loom::nn::Linear: a quantized layer cannot be split");
  if (!cut_by(style)) throw std::logic_error("loom::nn::Linear splits colwise or rowwise");
  torch::NoGradGuard no_grad;
  std::vector<split_parameter> cut;
  const auto keep = [&](at::Tensor& tensor, std::string name, std::int64_t dim) {
    at::Tensor(tensor).set_data(split->slice(tensor, dim));
    cut.push_back({std::move(name), dim});
  };
  if (style == parallel_style::colwise) {
    keep(weight, "weight", 0);
    if (bias.defined()) keep(bias, "bias", 0);
    if (adapter_) keep(lora_B, std::string(lora_adapter::b_name), 0);
    options.out_features(weight.size(0));
  } else {
    keep(weight, "weight", 1);
    if (adapter_) keep(lora_A, std::string(lora_adapter::a_name), 1);
    options.in_features(weight.size(1));
  }
  split_ = std::move(split);
  style_ = style;
  return cut;
}

void LinearImpl::add_adapter(const lora_adapter_options& options) {
  if (adapter_) throw std::logic_error("loom::nn::Linear already has a LoRA adapter");
  adapter_ = lora_adapter::attach(*this, this->options.in_features(), this->options.out_features(), options);
  lora_A = adapter_->lora_A;
  lora_B = adapter_->lora_B;
}

void LinearImpl::hold_quantized(quant::quantized_weight parts) {
  if (quantized_) throw std::logic_error("loom::nn::Linear is quantized already");
  if (parts.shape() != std::vector<std::int64_t>{options.out_features(), options.in_features()}) {
    throw std::logic_error("loom::nn::Linear given quantized parts of another weight's shape");
  }
  quantized_ = std::move(parts);
  parameters_.erase("weight");
  weight = at::Tensor();
  register_parameter(std::string(quant::quantized_weight::codes_name), quantized_->codes(), /*requires_grad=*/false);
  register_parameter(std::string(quant::quantized_weight::statistics_name), quantized_->statistics(),
                     /*requires_grad=*/false);
}

std::vector<parallel_module::exchange> LinearImpl::exchanges() const {
  if (!style_) return {};
  std::vector<exchange> sent;
  if (*style_ == parallel_style::colwise) {
    sent.push_back({"input gradient", collective_op::all_reduce, step_phase::backward, options.in_features()});
    if (adapter_) {
      sent.push_back({"adapter input gradient", collective_op::all_reduce, step_phase::backward, adapter_->rank});
    }
  } else {
    sent.push_back({"partial output", collective_op::all_reduce, step_phase::forward, options.out_features()});
    if (adapter_) {
      sent.push_back({"adapter partial output", collective_op::all_reduce, step_phase::forward, adapter_->rank});
    }
  }
  return sent;
}

at::Tensor LinearImpl::saved_weight(const at::Tensor& codes, const at::Tensor& statistics) const {
  if (!quantized_) throw std::logic_error("loom::nn::Linear::saved_weight of a layer that is not quantized");
  const quant::quantized_weight whole =
      quant::quantized_weight::from_parts(quantized_->options(), quantized_->shape(), codes, statistics);
  at::Tensor values = whole.dequantize(at::kFloat);
  if (adapter_ && merged_) adapter_->merge_into(values);
  return values;
}

void LinearImpl::merge() {
  if (!adapter_ || merged_) return;
  // Folded into quantized codes, the update would be quantized away: a quantized layer keeps adding it
  // in forward, and its saved weight is the dequantized base with the update (merged_weight).
  if (!quantized_) adapter_->merge_into(weight);
  merged_ = true;
}

void LinearImpl::unmerge() {
  if (!adapter_ || !merged_) return;
  if (!quantized_) adapter_->unmerge_from(weight);
  merged_ = false;
}

}  // namespace loom::nn

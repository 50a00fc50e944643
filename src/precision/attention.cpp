#include <loom/precision/attention.hpp>

#include <loom/precision/linear.hpp>

#include "cpu_autocast.hpp"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/custom_function.h>

#include <limits>
#include <optional>

namespace loom {
namespace {

// ATen's flash kernel takes an additive mask; a boolean one says where a query may attend.
std::optional<at::Tensor> additive(const std::optional<at::Tensor>& mask) {
  if (!mask || mask->scalar_type() != at::kBool) return mask ? std::optional(mask->to(at::kFloat)) : std::nullopt;
  return at::zeros(mask->sizes(), mask->options().dtype(at::kFloat))
      .masked_fill_(mask->logical_not(), -std::numeric_limits<float>::infinity());
}

// bf16 attention through the fp32 flash kernel, forward and backward; the operands and the output
// are saved in bf16 and widened again in backward, the log-sum-exp in fp32 as ATen saves it.
struct widened_attention : torch::autograd::Function<widened_attention> {
  static at::Tensor forward(torch::autograd::AutogradContext* context, const at::Tensor& query, const at::Tensor& key,
                            const at::Tensor& value, const std::optional<at::Tensor>& mask, bool causal,
                            std::optional<double> scale) {
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    auto [wide_out, logsumexp] = at::_scaled_dot_product_flash_attention_for_cpu(
        query.to(at::kFloat), key.to(at::kFloat), value.to(at::kFloat), /*dropout_p=*/0.0, causal, mask, scale);
    const at::Tensor out = wide_out.to(at::kBFloat16);
    context->save_for_backward({query, key, value, out, logsumexp});
    context->saved_data["mask"] = mask ? c10::IValue(*mask) : c10::IValue();
    context->saved_data["causal"] = causal;
    context->saved_data["scale"] = scale ? c10::IValue(*scale) : c10::IValue();
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* context,
                                                 const torch::autograd::variable_list& grad_outputs) {
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto saved = context->get_saved_variables();
    const c10::IValue& mask = context->saved_data["mask"];
    const c10::IValue& scale = context->saved_data["scale"];
    const auto wide = [](const at::Tensor& t) { return t.to(at::kFloat); };
    auto [grad_query, grad_key, grad_value] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        wide(grad_outputs[0]), wide(saved[0]), wide(saved[1]), wide(saved[2]), wide(saved[3]), saved[4],
        /*dropout_p=*/0.0, context->saved_data["causal"].toBool(),
        mask.isNone() ? std::nullopt : std::optional(mask.toTensor()),
        scale.isNone() ? std::nullopt : std::optional(scale.toDouble()));
    return {grad_query.to(at::kBFloat16), grad_key.to(at::kBFloat16), grad_value.to(at::kBFloat16), {}, {}, {}};
  }
};

bool all_bf16(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value) {
  return query.scalar_type() == at::kBFloat16 && key.scalar_type() == at::kBFloat16 &&
         value.scalar_type() == at::kBFloat16;
}

}  // namespace

at::Tensor scaled_dot_product_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                        const std::optional<at::Tensor>& mask, bool causal,
                                        std::optional<double> scale) {
  const auto aten = [&] {
    return at::scaled_dot_product_attention(query, key, value, mask, /*dropout_p=*/0.0, causal, scale);
  };
  if (!query.is_cpu() || uses_aten_bf16_products()) return aten();
  const bool autocast_to_bf16 = detail::cpu_autocasts_to_bf16() && query.is_floating_point();
  if (!autocast_to_bf16 && !all_bf16(query, key, value)) return aten();
  const auto narrow = [](const at::Tensor& t) { return t.to(at::kBFloat16); };
  return widened_attention::apply(narrow(query), narrow(key), narrow(value), additive(mask), causal, scale);
}

}  // namespace loom

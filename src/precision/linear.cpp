#include <loom/precision/linear.hpp>

#include <loom/base/text.hpp>

#include "cpu_autocast.hpp"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/cpu/Utils.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace loom {
namespace {

bool detect_bf16_products() {
  if (const char* choice = std::getenv("LOOM_BF16_PRODUCTS")) {
    if (std::string_view(choice) == "aten") return true;
    if (std::string_view(choice) != "auto") {
      throw_error<std::invalid_argument>(
          "LOOM_BF16_PRODUCTS is '{}': set it to 'aten' (ATen's bf16 kernel on every CPU) or 'auto' (the fp32 "
          "GEMM on a CPU without bf16 instructions), or unset it",
          choice);
    }
  }
  const auto capabilities = at::cpu::get_cpu_capabilities();
  const auto flag = [&](const std::string& name) {
    const auto found = capabilities.find(name);
    return found != capabilities.end() && found->second.isBool() && found->second.toBool();
  };
  const auto architecture = capabilities.find("architecture");
  // Off x86 (Arm's BF16 extension, through oneDNN or KleidiAI) ATen's choice stands.
  if (architecture == capabilities.end() || architecture->second.toStringRef() != "x86_64") return true;
  return flag("avx512_bf16") || flag("amx_bf16");
}

// A weight widened to fp32 a block of rows at a time, when it has more: an output head's (Qwen3's 151936 × 2048 would
// take 1.2 GB in fp32 at once) stays within this many fp32 values.
constexpr std::int64_t widened_block_values = std::int64_t{16} << 20;

std::int64_t rows_per_block(const at::Tensor& weight) {
  return std::max<std::int64_t>(1, widened_block_values / std::max<std::int64_t>(weight.size(1), 1));
}

// rows [tokens, in] (fp32) · weightᵀ ([out, in], bf16), in fp32.
at::Tensor widened_product(const at::Tensor& rows, const at::Tensor& weight) {
  const std::int64_t block = rows_per_block(weight);
  at::Tensor out = at::empty({rows.size(0), weight.size(0)}, rows.options());
  for (std::int64_t first = 0; first < weight.size(0); first += block) {
    const std::int64_t count = std::min(block, weight.size(0) - first);
    out.narrow(1, first, count).copy_(at::mm(rows, weight.narrow(0, first, count).to(at::kFloat).t()));
  }
  return out;
}

// grad [tokens, out] (fp32) · weight ([out, in], bf16), in fp32.
at::Tensor widened_input_grad(const at::Tensor& grad, const at::Tensor& weight) {
  const std::int64_t block = rows_per_block(weight);
  at::Tensor sum = at::zeros({grad.size(0), weight.size(1)}, grad.options());
  for (std::int64_t first = 0; first < weight.size(0); first += block) {
    const std::int64_t count = std::min(block, weight.size(0) - first);
    sum.addmm_(grad.narrow(1, first, count), weight.narrow(0, first, count).to(at::kFloat));
  }
  return sum;
}

// The bf16 product, its gradients too, through the fp32 GEMM. The operands are saved in bf16, so the
// activations kept for backward weigh what ATen's bf16 linear keeps. The bias is optional, the form
// in which autograd takes an input that may be absent.
struct widened_linear : torch::autograd::Function<widened_linear> {
  static at::Tensor forward(torch::autograd::AutogradContext* context, const at::Tensor& input,
                            const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    context->save_for_backward({input, weight});
    context->saved_data["has_bias"] = bias.has_value();
    const at::Tensor wide_bias = bias ? bias->to(at::kFloat) : at::Tensor();
    if (weight.size(0) <= rows_per_block(weight))
      return at::linear(input.to(at::kFloat), weight.to(at::kFloat), wide_bias).to(at::kBFloat16);
    const at::Tensor rows = input.reshape({-1, input.size(-1)}).to(at::kFloat);
    at::Tensor out = widened_product(rows, weight);
    if (bias) out.add_(wide_bias);
    std::vector<std::int64_t> shape = input.sizes().vec();
    shape.back() = weight.size(0);
    return out.to(at::kBFloat16).view(shape);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* context,
                                                 const torch::autograd::variable_list& grad_outputs) {
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto saved = context->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor grad = grad_outputs[0].to(at::kFloat);
    const at::Tensor grad_rows = grad.reshape({-1, grad.size(-1)});
    torch::autograd::variable_list grads(3);
    const bool whole = weight.size(0) <= rows_per_block(weight);
    if (context->needs_input_grad(0)) {
      grads[0] = whole ? grad.matmul(weight.to(at::kFloat)).to(at::kBFloat16)
                       : widened_input_grad(grad_rows, weight).to(at::kBFloat16).view(input.sizes());
    }
    if (context->needs_input_grad(1) && whole) {
      grads[1] = grad_rows.t().mm(input.reshape({-1, input.size(-1)}).to(at::kFloat)).to(at::kBFloat16);
    } else if (context->needs_input_grad(1)) {
      const at::Tensor input_rows = input.reshape({-1, input.size(-1)}).to(at::kFloat);
      const std::int64_t block = rows_per_block(weight);
      at::Tensor grad_weight = at::empty(weight.sizes(), weight.options().dtype(at::kBFloat16));
      for (std::int64_t first = 0; first < weight.size(0); first += block) {
        const std::int64_t count = std::min(block, weight.size(0) - first);
        grad_weight.narrow(0, first, count).copy_(grad_rows.narrow(1, first, count).t().mm(input_rows));
      }
      grads[1] = grad_weight;
    }
    if (context->saved_data["has_bias"].toBool() && context->needs_input_grad(2))
      grads[2] = grad_rows.sum(0).to(at::kBFloat16);
    return grads;
  }
};

at::Tensor widened(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias) {
  return widened_linear::apply(input, weight, bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt);
}

bool all_bf16(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias) {
  return input.scalar_type() == at::kBFloat16 && weight.scalar_type() == at::kBFloat16 &&
         (!bias.defined() || bias.scalar_type() == at::kBFloat16);
}

at::Tensor to_bf16(const at::Tensor& value) { return value.defined() ? value.to(at::kBFloat16) : value; }

}  // namespace

bool uses_aten_bf16_products() {
  // A fact of the hardware and of the environment the process started with: read once.
  static const bool aten = detect_bf16_products();
  return aten;
}

at::Tensor linear(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias) {
  if (!input.is_cpu() || uses_aten_bf16_products()) return at::linear(input, weight, bias);
  const bool autocast_to_bf16 =
      detail::cpu_autocasts_to_bf16() && input.is_floating_point() && weight.is_floating_point();
  if (autocast_to_bf16) return widened(to_bf16(input), to_bf16(weight), to_bf16(bias));
  if (all_bf16(input, weight, bias)) return widened(input, weight, bias);
  return at::linear(input, weight, bias);
}

}  // namespace loom

#include <loom/quant/quantized_weight.hpp>

#include <loom/base/text.hpp>
#include <loom/precision/linear.hpp>
#include <loom/quant/fp8.hpp>
#include <loom/quant/nf4.hpp>

#include <ATen/ATen.h>
#include <c10/util/irange.h>
#include <torch/autograd.h>

#include <fmt/ranges.h>

#include <stdexcept>
#include <utility>

namespace loom::quant {
namespace {

constexpr std::int64_t fp32_bytes = 4;

nf4_options nf4_of(const quantized_options& options) {
  return {.block_size = static_cast<std::int64_t>(options.block_size), .double_quant = options.double_quant};
}

fp8_scaling fp8_of(const quantized_options& options) {
  return options.scaling == loom::fp8_scaling::row ? fp8_scaling::row : fp8_scaling::tensor;
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Where each statistic lies in the statistics' bytes; the codes' bytes.
struct layout {
  std::int64_t code_bytes = 0;
  // nf4: the absmax (uint8 codes under double quantization, else fp32); fp8: the scales (fp32).
  std::int64_t absmax_count = 0;
  std::int64_t absmax_bytes = 0;
  // nf4 under double quantization: the absmax's fp32 scales, after the codes padded to 4 bytes, then the offset.
  std::int64_t scales_offset = 0;
  std::int64_t scale_count = 0;
  std::int64_t offset_offset = 0;
  std::int64_t statistics_bytes = 0;
};

layout layout_of(at::IntArrayRef shape, const quantized_options& options) {
  layout l;
  const std::int64_t numel = c10::multiply_integers(shape);
  if (options.format == quantized_format::fp8) {
    l.code_bytes = numel;
    l.absmax_count = options.scaling == loom::fp8_scaling::row ? shape[0] : 1;
    l.absmax_bytes = l.absmax_count * fp32_bytes;
    l.statistics_bytes = l.absmax_bytes;
    return l;
  }
  const nf4_options nf4 = nf4_of(options);
  l.code_bytes = ceil_div(numel, 2);
  l.absmax_count = ceil_div(numel, nf4.block_size);
  if (!nf4.double_quant) {
    l.absmax_bytes = l.absmax_count * fp32_bytes;
    l.statistics_bytes = l.absmax_bytes;
    return l;
  }
  l.absmax_bytes = l.absmax_count;
  l.scales_offset = ceil_div(l.absmax_bytes, fp32_bytes) * fp32_bytes;
  l.scale_count = ceil_div(l.absmax_count, nf4.statistics_block_size);
  l.offset_offset = l.scales_offset + l.scale_count * fp32_bytes;
  l.statistics_bytes = l.offset_offset + fp32_bytes;
  return l;
}

// `bytes` of the statistics from `offset` as `dtype` values: a view, no copy.
at::Tensor statistic(const at::Tensor& statistics, std::int64_t offset, std::int64_t bytes, at::ScalarType dtype) {
  return statistics.narrow(0, offset, bytes).view(dtype);
}

at::Tensor as_bytes(const at::Tensor& values) { return values.contiguous().view(at::kByte).reshape({-1}); }

void check_weight(const at::Tensor& weight) {
  if (weight.dim() != 2 || !at::isFloatingType(weight.scalar_type())) {
    throw_error<std::invalid_argument>(
        "quantized: a linear layer's weight of {} dimensions and dtype {}: quantize a floating [out, in] weight",
        weight.dim(), c10::toString(weight.scalar_type()));
  }
}

}  // namespace

quantized_weight::quantized_weight(const quantized_options& options, std::vector<std::int64_t> shape, at::Tensor codes,
                                   at::Tensor statistics)
    : options_(options), shape_(std::move(shape)), codes_(std::move(codes)), statistics_(std::move(statistics)) {}

quantized_weight quantized_weight::quantize(const at::Tensor& weight, const quantized_options& options) {
  check_weight(weight);
  const at::Tensor values = weight.detach();
  const layout l = layout_of(values.sizes(), options);
  at::Tensor codes;
  at::Tensor statistics = at::zeros({l.statistics_bytes}, values.options().dtype(at::kByte));
  if (options.format == quantized_format::fp8) {
    const fp8_weight quantized = quantize_fp8(values, fp8_of(options));
    codes = as_bytes(quantized.values);
    statistics.copy_(as_bytes(quantized.scale.to(at::kFloat)));
  } else {
    const nf4_weight quantized = quantize_nf4(values, nf4_of(options));
    codes = as_bytes(quantized.packed);
    if (!options.double_quant) {
      statistics.copy_(as_bytes(quantized.absmax.to(at::kFloat)));
    } else {
      statistics.narrow(0, 0, l.absmax_bytes).copy_(as_bytes(quantized.absmax));
      statistics.narrow(0, l.scales_offset, l.scale_count * fp32_bytes)
          .copy_(as_bytes(quantized.absmax_scale.to(at::kFloat)));
      statistics.narrow(0, l.offset_offset, fp32_bytes).copy_(as_bytes(quantized.absmax_offset.to(at::kFloat)));
    }
  }
  return {options, values.sizes().vec(), codes.clone(), statistics};
}

quantized_weight::part_sizes quantized_weight::sizes_of(at::IntArrayRef shape, const quantized_options& options) {
  const layout l = layout_of(shape, options);
  return {.codes = l.code_bytes, .statistics = l.statistics_bytes};
}

quantized_weight quantized_weight::from_parts(const quantized_options& options, at::IntArrayRef shape, at::Tensor codes,
                                              at::Tensor statistics) {
  const layout l = layout_of(shape, options);
  if (codes.scalar_type() != at::kByte || statistics.scalar_type() != at::kByte || codes.numel() != l.code_bytes ||
      statistics.numel() != l.statistics_bytes) {
    throw_error<std::invalid_argument>(
        "quantized: parts of {} and {} {} and {} for a [{}] weight in {}, which takes {} and {} bytes: give the "
        "parts quantized_weight::quantize made of this weight with these options",
        codes.numel(), statistics.numel(), c10::toString(codes.scalar_type()), c10::toString(statistics.scalar_type()),
        fmt::join(shape, ", "), name_of(options.format), l.code_bytes, l.statistics_bytes);
  }
  return {options, shape.vec(), std::move(codes), std::move(statistics)};
}

at::Tensor quantized_weight::dequantize(at::ScalarType dtype) const {
  const layout l = layout_of(shape_, options_);
  if (options_.format == quantized_format::fp8) {
    fp8_weight parts{.values = codes_.view(shape_), .scale = statistic(statistics_, 0, l.absmax_bytes, at::kFloat)};
    return dequantize_fp8(parts, dtype);
  }
  nf4_weight parts;
  parts.packed = codes_;
  if (!options_.double_quant) {
    parts.absmax = statistic(statistics_, 0, l.absmax_bytes, at::kFloat);
  } else {
    parts.absmax = statistics_.narrow(0, 0, l.absmax_bytes);
    parts.absmax_scale = statistic(statistics_, l.scales_offset, l.scale_count * fp32_bytes, at::kFloat);
    parts.absmax_offset = statistic(statistics_, l.offset_offset, fp32_bytes, at::kFloat);
  }
  return dequantize_nf4(parts, shape_, nf4_of(options_), dtype);
}

std::int64_t quantized_weight::bytes() const noexcept { return codes_.numel() + statistics_.numel(); }

namespace {

// What the backward needs of the weight: its parts (the layer's parameters, which a sharding engine
// gathers again before this backward runs), not its dequantized values.
void save_parts(torch::autograd::AutogradContext* context, const quantized_weight& weight) {
  const quantized_options& options = weight.options();
  context->saved_data["codes"] = weight.codes();
  context->saved_data["statistics"] = weight.statistics();
  context->saved_data["shape"] = weight.shape();
  context->saved_data["options"] = std::vector<std::int64_t>{
      static_cast<std::int64_t>(options.format), static_cast<std::int64_t>(options.block_size), options.double_quant,
      static_cast<std::int64_t>(options.scaling)};
}

quantized_weight saved_parts(torch::autograd::AutogradContext* context) {
  const std::vector<std::int64_t> settings = context->saved_data["options"].toIntVector();
  const quantized_options options{.format = static_cast<quantized_format>(settings[0]),
                                  .block_size = static_cast<std::size_t>(settings[1]),
                                  .double_quant = settings[2] != 0,
                                  .scaling = static_cast<loom::fp8_scaling>(settings[3])};
  return quantized_weight::from_parts(options, context->saved_data["shape"].toIntVector(),
                                      context->saved_data["codes"].toTensor(),
                                      context->saved_data["statistics"].toTensor());
}

// input · Wᵀ (+ bias, in the same addmm as at::linear adds it), W dequantized in forward and again in
// backward. Two functions, as an autograd function takes no undefined tensor among its inputs.
struct dequantizing_linear : torch::autograd::Function<dequantizing_linear> {
  static at::Tensor forward(torch::autograd::AutogradContext* context, const at::Tensor& input,
                            const quantized_weight& weight) {
    save_parts(context, weight);
    return loom::linear(input, weight.dequantize(input.scalar_type()), {});
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* context,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor& grad = grads[0];
    return {at::matmul(grad, saved_parts(context).dequantize(grad.scalar_type())), at::Tensor()};
  }
};

struct dequantizing_affine : torch::autograd::Function<dequantizing_affine> {
  static at::Tensor forward(torch::autograd::AutogradContext* context, const at::Tensor& input, const at::Tensor& bias,
                            const quantized_weight& weight) {
    save_parts(context, weight);
    return loom::linear(input, weight.dequantize(input.scalar_type()), bias.to(input.scalar_type()));
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* context,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor& grad = grads[0];
    at::Tensor grad_input;
    if (context->needs_input_grad(0))
      grad_input = at::matmul(grad, saved_parts(context).dequantize(grad.scalar_type()));
    at::Tensor grad_bias;
    if (context->needs_input_grad(1)) grad_bias = grad.reshape({-1, grad.size(-1)}).sum(0);
    return {grad_input, grad_bias, at::Tensor()};
  }
};

}  // namespace

at::Tensor linear(const at::Tensor& input, const quantized_weight& weight, const at::Tensor& bias) {
  // Rows in, rows out: the functions' outputs are their own tensors, not views (at::linear's view of a
  // batch would be one created inside a custom function, which an adapter's in-place update may not touch).
  const at::Tensor rows = input.reshape({-1, input.size(-1)});
  const at::Tensor out =
      bias.defined() ? dequantizing_affine::apply(rows, bias, weight) : dequantizing_linear::apply(rows, weight);
  std::vector<std::int64_t> shape = input.sizes().vec();
  shape.back() = out.size(-1);
  return out.view(shape);
}

}  // namespace loom::quant

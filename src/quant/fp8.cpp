#include <loom/quant/fp8.hpp>

#include <loom/base/text.hpp>

#include "dtype_name.hpp"

#include <fmt/ranges.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <array>
#include <cstdint>

#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace loom::quant {
namespace {

using detail::dtype_name;

// torch.finfo(torch.float8_e4m3fn).max
constexpr double e4m3_max = 448.0;

bool is_fp8_source(at::ScalarType dtype) { return dtype == at::kBFloat16 || dtype == at::kHalf || dtype == at::kFloat; }

// The scale broadcast over a tensor of `dim` dimensions: [1] as it is, [rows] as [rows, 1, ...].
at::Tensor broadcast_scale(const at::Tensor& scale, std::int64_t dim, bool per_row) {
  if (!per_row) return scale.reshape({});
  std::vector<std::int64_t> shape(static_cast<std::size_t>(dim), 1);
  shape[0] = scale.numel();
  return scale.reshape(shape);
}

// The CPU's dequantization: per row the 256 values byte → float8 in fp32 · scale, cast to T (once
// while the scale stays the same), then a lookup per element: ATen's product and cast, faster.
template <class T>
void dequantize_on_cpu(const std::uint8_t* values, const float* scale, T* out, std::int64_t rows,
                       std::int64_t row_length, bool per_row) {
  std::array<float, 256> decoded{};
  for (std::size_t byte = 0; byte < 256; ++byte) {
    decoded[byte] =
        static_cast<float>(c10::Float8_e4m3fn(static_cast<std::uint8_t>(byte), c10::Float8_e4m3fn::from_bits()));
  }
  const std::int64_t grain = std::max<std::int64_t>(1, 65536 / std::max<std::int64_t>(row_length, 1));
  at::parallel_for(0, rows, grain, [&](std::int64_t first, std::int64_t end) {
    std::array<T, 256> lut{};
    bool filled = false;
    float current = 0;
    for (std::int64_t row = first; row < end; ++row) {
      const float factor = scale[per_row ? row : 0];
      if (!filled || factor != current) {
        for (std::size_t byte = 0; byte < 256; ++byte) lut[byte] = static_cast<T>(decoded[byte] * factor);
        current = factor;
        filled = true;
      }
      const std::uint8_t* source = values + row * row_length;
      T* target = out + row * row_length;
      for (std::int64_t j = 0; j < row_length; ++j) target[j] = lut[source[j]];
    }
  });
}

}  // namespace

fp8_weight quantize_fp8(const at::Tensor& values, fp8_scaling scaling) {
  if (!values.defined()) {
    throw_error<std::invalid_argument>(
        "loom::quant::quantize_fp8: the tensor is undefined; pass the values to quantize");
  }
  if (!is_fp8_source(values.scalar_type())) {
    throw_error<std::invalid_argument>(
        "loom::quant::quantize_fp8: the tensor is {}; fp8 quantizes bf16, fp16 or fp32 values: convert it first",
        dtype_name(values.scalar_type()));
  }
  if (values.numel() == 0) {
    throw_error<std::invalid_argument>("loom::quant::quantize_fp8: the tensor is empty; there is nothing to quantize");
  }
  const bool per_row = scaling == fp8_scaling::row;
  if (per_row && values.dim() < 2) {
    throw_error<std::invalid_argument>(
        "loom::quant::quantize_fp8: row scaling needs rows, and the tensor has {} dimension{}; quantize it with "
        "fp8_scaling::tensor",
        values.dim(), values.dim() == 1 ? "" : "s");
  }
  c10::NoGradGuard no_grad;
  const at::Tensor w = values.detach();
  // _choose_scale_float8: amax in w's dtype, / 448 in w's dtype, then fp32.
  const at::Tensor amax = per_row ? w.reshape({w.size(0), -1}).abs().amax(1) : w.abs().amax().reshape({1});
  const at::Tensor scale =
      at::div(amax, e4m3_max).to(at::kFloat).clamp_min(static_cast<double>(std::numeric_limits<float>::min()));
  // _quantize_affine_float8: fp32 / scale, clamped to ±448, rounded to e4m3fn.
  const at::Tensor scaled = at::clamp(w.to(at::kFloat) / broadcast_scale(scale, w.dim(), per_row), -e4m3_max, e4m3_max);
  return {scaled.to(at::kFloat8_e4m3fn).view(at::kByte), scale.contiguous()};
}

at::Tensor dequantize_fp8(const fp8_weight& weight, at::ScalarType dtype) {
  if (!is_fp8_source(dtype)) {
    throw_error<std::invalid_argument>(
        "loom::quant::dequantize_fp8: dtype {} is not one fp8 dequantizes to; ask for bf16, fp16 or fp32",
        dtype_name(dtype));
  }
  if (!weight.values.defined() || weight.values.scalar_type() != at::kByte) {
    throw_error<std::invalid_argument>(
        "loom::quant::dequantize_fp8: the values are {}; they should be uint8, the bytes of float8_e4m3fn that "
        "quantize_fp8 made",
        weight.values.defined() ? dtype_name(weight.values.scalar_type()) : "undefined");
  }
  if (!weight.scale.defined() || weight.scale.scalar_type() != at::kFloat) {
    throw_error<std::invalid_argument>(
        "loom::quant::dequantize_fp8: the scale is {}; it should be fp32, [1] per tensor or [rows] per row",
        weight.scale.defined() ? dtype_name(weight.scale.scalar_type()) : "undefined");
  }
  const std::int64_t rows = weight.values.dim() >= 2 ? weight.values.size(0) : 1;
  const bool per_tensor = weight.scale.numel() == 1;
  if (!per_tensor && (weight.values.dim() < 2 || weight.scale.numel() != rows)) {
    throw_error<std::invalid_argument>(
        "loom::quant::dequantize_fp8: the scale has {} elements for values of shape [{}]; it should have 1 (per "
        "tensor) or {} (one a row)",
        weight.scale.numel(), fmt::join(weight.values.sizes(), ", "), rows);
  }
  c10::NoGradGuard no_grad;
  if (weight.values.device().is_cpu()) {
    const at::Tensor values = weight.values.contiguous();
    const at::Tensor factors = weight.scale.reshape(-1).contiguous();
    at::Tensor out = at::empty(values.sizes(), values.options().dtype(dtype));
    const std::int64_t count = values.numel();
    if (count == 0) return out;
    const std::int64_t row_count = values.dim() >= 1 ? values.size(0) : 1;  // per tensor too: rows share the scale
    const std::int64_t row_length = count / row_count;
    const auto* bytes = values.data_ptr<std::uint8_t>();
    const auto* scale = factors.data_ptr<float>();
    switch (dtype) {
      case at::kBFloat16:
        dequantize_on_cpu(bytes, scale, out.data_ptr<c10::BFloat16>(), row_count, row_length, !per_tensor);
        break;
      case at::kHalf:
        dequantize_on_cpu(bytes, scale, out.data_ptr<c10::Half>(), row_count, row_length, !per_tensor);
        break;
      default: dequantize_on_cpu(bytes, scale, out.data_ptr<float>(), row_count, row_length, !per_tensor); break;
    }
    return out;
  }
  const at::Tensor scale = broadcast_scale(weight.scale.to(weight.values.device()), weight.values.dim(), !per_tensor);
  // _dequantize_affine_float8: fp8 in fp32 · scale, then the dtype.
  at::Tensor out = at::empty(weight.values.sizes(), weight.values.options().dtype(dtype));
  at::mul_out(out, weight.values.view(at::kFloat8_e4m3fn).to(at::kFloat), scale);
  return out;
}

}  // namespace loom::quant

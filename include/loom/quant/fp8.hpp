#pragma once
// fp8 weight-only quantization as torchao's Float8WeightOnlyConfig makes it (float8_e4m3fn,
// Float8Tensor.from_hp on its "torch" kernel: torchao/quantization/quant_primitives.py's
// _choose_scale_float8, _quantize_affine_float8 and _dequantize_affine_float8):
// - amax = max |w| over the whole tensor (fp8_scaling::tensor, torchao's PerTensor) or over each
//   row (fp8_scaling::row: each slice along dim 0, torchao's PerRow of a 2-D weight), in w's dtype;
// - scale = amax / 448 computed in w's dtype (torchao divides the amax tensor, so a bf16 weight's
//   scale is rounded to bf16), then fp32;
// - values = (w in fp32 / scale) clamped to ±448, cast to float8_e4m3fn (round to nearest even);
// - dequantized = fp8 value in fp32 · scale, cast to the dtype asked for.
// One difference: where the scale is 0 (an all-zero row or tensor; or an fp16 amax whose scale
// underflows fp16), torchao's torch path divides by it (0 / 0: NaN codes); loom clamps the fp32 scale
// to the smallest normal float (1.18e-38), as torchao's float8 training clamps its amax to an eps:
// a zero row is zero bytes and dequantizes to zeros.
// The values are kept as uint8, the bytes of float8_e4m3fn, so that every c10d backend (Gloo too)
// carries them. Deterministic: the same bytes on every rank for the same values.

#include <ATen/core/Tensor.h>

namespace loom::quant {

enum class fp8_scaling { tensor, row };

struct fp8_weight {
  at::Tensor values;  // uint8, the bytes of float8_e4m3fn, the weight's shape (uint8 so every c10d backend, Gloo too,
                      // carries it)
  at::Tensor scale;   // fp32: [1] per tensor, [rows] per row
};

// `values` (bf16, fp16 or fp32) in fp8; fp8_scaling::row needs at least 2 dimensions.
// std::invalid_argument for another dtype, an empty tensor, or a row scaling of a tensor without rows.
[[nodiscard]] fp8_weight quantize_fp8(const at::Tensor& values, fp8_scaling scaling);

// The values in `dtype` (bf16, fp16 or fp32), values' shape, on values' device; the scale's size says
// whether it is per tensor ([1]) or per row ([rows]). std::invalid_argument when the parts do not fit.
[[nodiscard]] at::Tensor dequantize_fp8(const fp8_weight& weight, at::ScalarType dtype);

}  // namespace loom::quant

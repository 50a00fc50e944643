#pragma once
// A linear layer's frozen weight held quantized (quantized(...), loom/dsl/quantized.hpp): NF4 or fp8
// (loom/quant/nf4.hpp, fp8.hpp) as two flat byte tensors, the codes and the statistics, which the
// layer registers as parameters in the weight's place. Bytes, not the statistics' own fp32, so that a
// sharding engine shards, gathers and frees them as any parameter, in one all-gather with the rest of
// a unit's bytes, and mixed precision never casts them (Answer.AI's FSDP + QLoRA holds bitsandbytes'
// 4-bit weights in flat uint8 storage for the same reasons).

#include <loom/dsl/quantized.hpp>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string_view>
#include <vector>

namespace loom::quant {

class quantized_weight {
 public:
  // The parts' names on the layer, beside its `bias`.
  static constexpr std::string_view codes_name = "weight_codes";
  static constexpr std::string_view statistics_name = "weight_statistics";

  // `weight` [out, in] (any floating dtype) quantized as `options` say; deterministic, the same bytes
  // on every rank.
  [[nodiscard]] static quantized_weight quantize(const at::Tensor& weight, const quantized_options& options);
  // The parts' sizes, in bytes, for a weight of `shape`.
  struct part_sizes {
    std::int64_t codes = 0;
    std::int64_t statistics = 0;
  };
  [[nodiscard]] static part_sizes sizes_of(at::IntArrayRef shape, const quantized_options& options);
  // Parts quantized before, of a weight of `shape`, or to be filled (tensors without their bytes yet);
  // their sizes checked against it.
  [[nodiscard]] static quantized_weight from_parts(const quantized_options& options, at::IntArrayRef shape,
                                                   at::Tensor codes, at::Tensor statistics);

  [[nodiscard]] const quantized_options& options() const noexcept { return options_; }
  [[nodiscard]] const std::vector<std::int64_t>& shape() const noexcept { return shape_; }
  // uint8: nf4's packed codes, two a byte; fp8's e4m3 bytes, the weight's shape flattened.
  [[nodiscard]] const at::Tensor& codes() const noexcept { return codes_; }
  // uint8: nf4's absmax (its 8-bit codes, then the fp32 scales of their blocks and the fp32 offset, under
  // double quantization; fp32 otherwise); fp8's fp32 scales.
  [[nodiscard]] const at::Tensor& statistics() const noexcept { return statistics_; }

  // The weight, [out, in], in `dtype`, from the parts as they are now (a sharding engine's gathered ones).
  [[nodiscard]] at::Tensor dequantize(at::ScalarType dtype) const;
  // The bytes held, codes and statistics, against `dtype`'s bytes for the weight.
  [[nodiscard]] std::int64_t bytes() const noexcept;

 private:
  quantized_weight(const quantized_options& options, std::vector<std::int64_t> shape, at::Tensor codes,
                   at::Tensor statistics);

  quantized_options options_;
  std::vector<std::int64_t> shape_;
  at::Tensor codes_;
  at::Tensor statistics_;
};

// input · Wᵀ + bias, W dequantized in the input's dtype for the product and again for the input's
// gradient in backward: no dequantized weight is kept between them. W does not train; a bias that
// requires grad gets its gradient.
[[nodiscard]] at::Tensor linear(const at::Tensor& input, const quantized_weight& weight, const at::Tensor& bias);

// What quantized(...) made of a model's base, for job.describe().
struct quantized_base {
  std::size_t layers = 0;
  std::int64_t bytes = 0;       // the quantized parts'
  std::int64_t bf16_bytes = 0;  // the same weights' in bf16
};

}  // namespace loom::quant

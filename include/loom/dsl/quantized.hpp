// quantized(format): the frozen base's linear weights held quantized (QLoRA), dequantized in each
// layer's forward and again in its backward; the adapters that lora(...) adds train in full precision
// over them. loom::nf4 is bitsandbytes' 4-bit NormalFloat (transformers' BitsAndBytesConfig with
// load_in_4bit, bnb_4bit_quant_type="nf4"), loom::fp8 torchao's float8 weight-only (e4m3). Under
// fsdp() the quantized bytes are sharded like any parameter. docs/quantization.md.
#pragma once

#include <loom/dsl/describe.hpp>
#include <loom/dsl/diagnostics.hpp>
#include <loom/dsl/options.hpp>
#include <loom/dsl/pipe.hpp>
#include <loom/dsl/stage_kind.hpp>

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>

namespace loom {

enum class quantized_format : unsigned char {
  nf4,  // 4-bit NormalFloat in blocks, bitsandbytes' bytes
  fp8,  // float8 e4m3 with a scale per row or per tensor
};
inline constexpr quantized_format nf4 = quantized_format::nf4;
inline constexpr quantized_format fp8 = quantized_format::fp8;

// What one fp8 scale covers.
enum class fp8_scaling : unsigned char { row, tensor };

constexpr std::string_view name_of(quantized_format format) noexcept {
  return format == quantized_format::nf4 ? "nf4" : "fp8";
}
constexpr std::string_view name_of(fp8_scaling scaling) noexcept {
  return scaling == fp8_scaling::row ? "row" : "tensor";
}
// Every value of each, as a run file names them.
constexpr std::array<quantized_format, 2> values_of(std::type_identity<quantized_format>) noexcept {
  return {quantized_format::nf4, quantized_format::fp8};
}
constexpr std::array<fp8_scaling, 2> values_of(std::type_identity<fp8_scaling>) noexcept {
  return {fp8_scaling::row, fp8_scaling::tensor};
}

struct quantized_options {
  quantized_format format = quantized_format::nf4;
  // nf4: elements that share one absmax, over the flattened weight (bnb_4bit's blocksize).
  std::size_t block_size = 64;
  // nf4: the absmax statistics quantized again, to 8 bits in blocks of 256 (bnb_4bit_use_double_quant).
  bool double_quant = true;
  // fp8: one scale per output row (torchao's per-row weight-only) or one for the tensor.
  fp8_scaling scaling = fp8_scaling::row;

  static constexpr auto fields() {
    return std::tuple{option_field{"format", &quantized_options::format},
                      option_field{"block_size", &quantized_options::block_size},
                      option_field{"double_quant", &quantized_options::double_quant},
                      option_field{"scaling", &quantized_options::scaling}};
  }
};

class quantized_stage : public detail::pipeable {
 public:
  using options_type = quantized_options;
  static constexpr stage_kind kind = stage_kind::quantized;
  static constexpr std::string_view name = "quantized";

  // For values known only at run time: the checks of quantized(...), throwing plan_error.
  static constexpr quantized_stage checked(const quantized_options& settings) {
    detail::enforce(block_size_fits(settings) ? violation::none : violation::r21_block_size);
    return quantized_stage(settings);
  }

  [[nodiscard]] constexpr const quantized_options& settings() const noexcept { return settings_; }
  // The options that apply to the format: nf4's block and double quantization, fp8's scaling.
  [[nodiscard]] std::string options() const {
    std::string text = "format=" + std::string(name_of(settings_.format));
    if (settings_.format == quantized_format::nf4) {
      return text + ", block_size=" + detail::to_text(settings_.block_size) +
             ", double_quant=" + detail::to_text(settings_.double_quant);
    }
    return text + ", scaling=" + std::string(name_of(settings_.scaling));
  }
  [[nodiscard]] std::string describe() const { return detail::call_text(name, options()); }

 private:
  constexpr explicit quantized_stage(const quantized_options& settings) : settings_(settings) {}

  // bitsandbytes' 4-bit block sizes (quantize_4bit): powers of two from 32 to 4096.
  static constexpr bool block_size_fits(const quantized_options& settings) noexcept {
    if (settings.format != quantized_format::nf4) return true;
    const std::size_t size = settings.block_size;
    return size >= 32 && size <= 4096 && (size & (size - 1)) == 0;
  }

  quantized_options settings_;
};

// Constant arguments, checked while compiling: quantized(loom::nf4), quantized(loom::fp8), or
// quantized({.format = loom::nf4, .block_size = 128}). With run-time values use quantized_stage::checked.
consteval quantized_stage quantized(quantized_options settings) { return quantized_stage::checked(settings); }
consteval quantized_stage quantized(quantized_format format) { return quantized_stage::checked({.format = format}); }

}  // namespace loom

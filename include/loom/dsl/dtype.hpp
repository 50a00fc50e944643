// Element types, as the DSL names them without LibTorch: loom::bf16, loom::fp16, loom::fp32. The
// runtime maps each to its at::ScalarType (loom/precision/precision.hpp).
#pragma once

#include <array>
#include <optional>
#include <string_view>

namespace loom {

// PyTorch's names, in the order of docs/dsl.md; the integral ones exist so that a plan naming one
// is refused with a sentence rather than an unknown name.
enum class dtype : unsigned char { float32, bfloat16, float16, float64, int64, int32, int16, int8, uint8, boolean };

inline constexpr dtype fp32 = dtype::float32;
inline constexpr dtype bf16 = dtype::bfloat16;
inline constexpr dtype fp16 = dtype::float16;
inline constexpr dtype fp64 = dtype::float64;

constexpr bool is_floating(dtype t) noexcept { return t <= dtype::float64; }

// Narrower than fp32: what mixed precision computes in.
constexpr bool is_reduced_precision(dtype t) noexcept { return t == dtype::bfloat16 || t == dtype::float16; }

struct dtype_name {
  dtype type;
  std::string_view short_name;  // as describe() prints it
  std::string_view torch_name;  // torch.<name>
};

inline constexpr std::array<dtype_name, 10> dtype_names{{{dtype::float32, "fp32", "float32"},
                                                         {dtype::bfloat16, "bf16", "bfloat16"},
                                                         {dtype::float16, "fp16", "float16"},
                                                         {dtype::float64, "fp64", "float64"},
                                                         {dtype::int64, "int64", "int64"},
                                                         {dtype::int32, "int32", "int32"},
                                                         {dtype::int16, "int16", "int16"},
                                                         {dtype::int8, "int8", "int8"},
                                                         {dtype::uint8, "uint8", "uint8"},
                                                         {dtype::boolean, "bool", "bool"}}};

constexpr std::string_view name_of(dtype t) noexcept {
  for (const dtype_name& entry : dtype_names)
    if (entry.type == t) return entry.short_name;
  return {};
}

// "bf16" or "bfloat16" (PyTorch's), and so on; none for anything else.
constexpr std::optional<dtype> dtype_named(std::string_view name) noexcept {
  for (const dtype_name& entry : dtype_names)
    if (entry.short_name == name || entry.torch_name == name) return entry.type;
  return std::nullopt;
}

}  // namespace loom

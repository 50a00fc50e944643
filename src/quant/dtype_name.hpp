#pragma once
// The names loom's messages give the dtypes the quantizers take and make (the DSL's: fp32, bf16, ...).

#include <c10/core/ScalarType.h>

#include <string>

namespace loom::quant::detail {

inline std::string dtype_name(at::ScalarType dtype) {
  switch (dtype) {
    case at::kByte: return "uint8";
    case at::kFloat: return "fp32";
    case at::kBFloat16: return "bf16";
    case at::kHalf: return "fp16";
    default: return c10::toString(dtype);
  }
}

}  // namespace loom::quant::detail

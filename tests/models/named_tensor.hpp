#pragma once
// What the parity programs share: a tensor of the file their Python driver wrote, by name.

#include <loom/runtime/tensors.hpp>

#include <ATen/core/Tensor.h>
#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <string_view>
#include <vector>

namespace loom::testing {

// The tensor `name` of `tensors` (a driver's file as load_safetensors read it); a runtime_error
// naming what is missing otherwise.
inline at::Tensor named(const std::vector<loom::named_tensor>& tensors, std::string_view name) {
  const auto found =
      std::find_if(tensors.begin(), tensors.end(), [&](const loom::named_tensor& t) { return t.name == name; });
  if (found == tensors.end()) {
    throw std::runtime_error(
        fmt::format("the driver's file has no tensor '{}': run the test through its driver", name));
  }
  return found->tensor;
}

}  // namespace loom::testing

#pragma once
// Whether torch.autocast would cast a CPU operation's floating operands to bf16: where loom::linear
// and loom::scaled_dot_product_attention round them to bf16 themselves before widening.
// Private to the precision wing.

#include <ATen/autocast_mode.h>

namespace loom::detail {

[[nodiscard]] inline bool cpu_autocasts_to_bf16() {
  return at::autocast::is_autocast_enabled(at::kCPU) && at::autocast::get_autocast_dtype(at::kCPU) == at::kBFloat16;
}

}  // namespace loom::detail

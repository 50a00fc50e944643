#pragma once
// loom::scaled_dot_product_attention: at::scaled_dot_product_attention, with bf16 attention taken
// through ATen's fp32 flash kernel on a CPU that has no bf16 dot-product instructions, as
// loom::linear takes bf16 products (loom/precision/linear.hpp). There ATen's bf16 flash attention
// multiplies its blocks by a reference loop, 4-5 times slower than its fp32 kernel, forward and
// backward. Widened, the scores, the softmax and its products stay in fp32 where ATen's bf16 kernel
// rounds the probabilities to bf16 before multiplying them by the values: the result differs from
// ATen's by that rounding, and is nearer the exact one. Queries, keys, values and the output are
// kept for backward in bf16, as ATen's bf16 kernel keeps them, so activations weigh the same.
// Under torch.autocast the operands are rounded to bf16 first, as autocast's cast would.

#include <ATen/core/Tensor.h>

#include <optional>

namespace loom {

// The arguments of at::scaled_dot_product_attention without dropout: [batch, heads, tokens, dim]
// query, key and value, an optional mask (true, or 0, where a query may attend; otherwise added to
// the scores), causal masking, and the scale (1/sqrt(dim) when absent).
[[nodiscard]] at::Tensor scaled_dot_product_attention(const at::Tensor& query, const at::Tensor& key,
                                                      const at::Tensor& value,
                                                      const std::optional<at::Tensor>& mask = std::nullopt,
                                                      bool causal = false, std::optional<double> scale = std::nullopt);

}  // namespace loom

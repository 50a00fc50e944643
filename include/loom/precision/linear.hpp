#pragma once
// loom::linear: at::linear, with bf16 products taken through the fp32 GEMM on a CPU that has no
// bf16 dot-product instructions (no AVX-512-BF16 or AMX). There ATen's bf16 GEMM is a reference
// loop, 10-50x slower than its fp32 one, while both sum the products in fp32 and round once: the
// fp32 GEMM on the widened bf16 operands gives the same values but for the order of the sums.
// Under torch.autocast the operands are rounded to bf16 first, as autocast's cast would.

#include <ATen/core/Tensor.h>

namespace loom {

[[nodiscard]] at::Tensor linear(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias = {});

// Whether ATen's bf16 GEMM runs: on a CPU that multiplies bf16 natively, or where the environment
// says LOOM_BF16_PRODUCTS=aten (to compare with PyTorch kernel for kernel). Read once.
[[nodiscard]] bool uses_aten_bf16_products();

}  // namespace loom

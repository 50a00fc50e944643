#pragma once
// NF4, QLoRA's 4-bit NormalFloat, byte for byte as bitsandbytes 0.50.2's quantize_4bit(values,
// quant_type="nf4", blocksize=block_size, compress_statistics=double_quant) makes it, and its
// dequantize_4bit bit for bit (tests/quant's quant-vs-bitsandbytes checks both against the library).
//
// What bitsandbytes does, and loom with it:
// - blocks of block_size values over the flattened tensor (row-major), the last one partial when
//   numel is not a multiple; each block's absmax = max |v| in fp32;
// - each value scaled into [-1, 1] as its PyTorch path (backends/default/ops.py, what bitsandbytes
//   runs on a CPU) scales it: v * (1 / max(absmax, 1e-38)) in a whole block, v / max(absmax, 1e-38)
//   in the partial last one (whose stored absmax is that clamped value), then clamped to [-1, 1];
// - the code: the CUDA kernel's dQuantizeNF4 tree, the 15 midpoints of the code book, a value on a
//   midpoint to the lower code (the PyTorch path's bucketize over the same fp32 midpoints agrees);
// - two codes a byte, the first element in the high nibble; an odd numel's last low nibble codes a
//   padding 0.0 (code 7, as both bitsandbytes paths pad);
// - double quantization (compress_statistics): offset = mean(absmax) (fp32), then absmax - offset
//   quantized blockwise (statistics_block_size, 256 in quantize_4bit) with the signed 8-bit dynamic
//   map: each statistics block's absmax (bnb's state2.absmax) and each value's code of
//   v * (1 / that absmax) by the CUDA kernel's dQuantize<0> (the nearest code by fp32 midpoints,
//   a value on a midpoint to the even code; a block whose absmax is 0 all code 0, as CUDA's and the
//   CPU kernel's). bitsandbytes' CPU kernel (cquantize_blockwise_cpu_fp32) looks the code up in a
//   65536-step table instead, which now and then picks the neighbouring code: loom follows CUDA;
// - dequantization: code_book[nibble] · absmax[block] in fp32, then cast to the dtype; under double
//   quantization absmax = dynamic_map[code] · absmax_scale[block / statistics_block_size], then
//   + offset, in fp32 (two roundings, as bitsandbytes' dequantize_blockwise, then its += offset).
//   bitsandbytes' CPU kernel for an even last dimension (cdequantize_blockwise_cpu_nf4_*) picks the
//   wrong absmax when that dimension is not a multiple of the block size; loom follows its flat
//   PyTorch path and its CUDA kernel, which are right.
// Where bitsandbytes' CUDA kernel differs from its PyTorch path, loom follows the PyTorch path (the
// library a CPU test can run): in a partial last block CUDA multiplies by 1 / absmax (a scaled value
// can differ by one ulp), and a block of zeros CUDA codes as 0 (its 0 · inf is NaN; -1 · 0 dequantizes
// to -0.0) where the PyTorch path codes 7 (the code of 0.0) and stores 1e-38 as a partial block's absmax.
//
// Quantization is deterministic: ATen operations with one order, the same on every rank for the same
// values on the same kind of device (the statistics' mean is ATen's, as bitsandbytes' is torch's).

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace loom::quant {

struct nf4_options {
  std::int64_t block_size = 64;              // bitsandbytes' blocksize over the flattened tensor
  bool double_quant = true;                  // bitsandbytes' compress_statistics
  std::int64_t statistics_block_size = 256;  // the absmax statistics' blocks under double quantization
};

// A tensor in NF4: the parts bitsandbytes' quantize_4bit(..., quant_type="nf4", compress_statistics=...) gives.
struct nf4_weight {
  at::Tensor packed;         // uint8 [ceil(numel / 2)]: two codes a byte, the first element in the high nibble
  at::Tensor absmax;         // double_quant: uint8 [blocks], codes of the 8-bit signed dynamic map; else fp32 [blocks]
  at::Tensor absmax_scale;   // double_quant: fp32 [ceil(blocks / statistics_block_size)] (bnb's state2.absmax); else
                             // undefined
  at::Tensor absmax_offset;  // double_quant: fp32 [1] (bnb's offset, the absmax's mean); else undefined
};

// `values` (bf16, fp16 or fp32, any shape, not empty) in NF4, on the device it lives on.
// std::invalid_argument for another dtype, an empty tensor, a block size bitsandbytes does not take
// (32, 64, 128, ..., 4096; statistics 64, ..., 4096).
[[nodiscard]] nf4_weight quantize_nf4(const at::Tensor& values, const nf4_options& options = {});

// The values, shaped `shape`, in `dtype` (bf16/fp16/fp32), from the parts (which may live on any device and be
// views of gathered storage: they are only read). On packed's device. std::invalid_argument when a part's dtype
// or size does not fit `shape` and `options`.
[[nodiscard]] at::Tensor dequantize_nf4(const nf4_weight& weight, at::IntArrayRef shape, const nf4_options& options,
                                        at::ScalarType dtype);

// The 16 values of the QLoRA code book and the 256 of bitsandbytes' signed 8-bit dynamic map
// (create_dynamic_map(signed=True), sorted), fp32, on the CPU.
[[nodiscard]] at::Tensor nf4_code_book();
[[nodiscard]] at::Tensor dynamic_map();

}  // namespace loom::quant

// loom::quant: NF4's code book, packing, round trip and errors, and fp8 weight-only against hand
// computations. tests/quant/quant_vs_bitsandbytes.py checks both against the libraries.
#include <loom/quant/fp8.hpp>
#include <loom/quant/nf4.hpp>
#include <loom/quant/quantized_weight.hpp>

#include <ATen/ATen.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_exception.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cstdint>
#include <limits>
#include <vector>

using Catch::Matchers::ContainsSubstring;
using loom::quant::fp8_scaling;
using loom::quant::nf4_options;

namespace {

std::vector<std::uint8_t> bytes_of(const at::Tensor& tensor) {
  const at::Tensor flat = tensor.reshape(-1).contiguous();
  return {flat.data_ptr<std::uint8_t>(), flat.data_ptr<std::uint8_t>() + flat.numel()};
}

at::Tensor random_normal(std::vector<std::int64_t> shape, std::uint64_t seed) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::normal(0.0, 1.0, shape, generator);
}

// Each element's block absmax (blocks over the flattened tensor).
at::Tensor block_absmax_of(const at::Tensor& values, std::int64_t block_size) {
  const at::Tensor flat = values.reshape(-1).to(at::kFloat);
  const std::int64_t count = flat.numel();
  const std::int64_t blocks = (count + block_size - 1) / block_size;
  const at::Tensor grid = at::constant_pad_nd(flat, {0, blocks * block_size - count}, 0).view({blocks, block_size});
  return grid.abs().amax(1, true).expand({blocks, block_size}).reshape(-1).narrow(0, 0, count).view(values.sizes());
}

}  // namespace

TEST_CASE("nf4 code book and the dynamic map are bitsandbytes'") {
  const at::Tensor code = loom::quant::nf4_code_book();
  REQUIRE(code.scalar_type() == at::kFloat);
  REQUIRE(code.numel() == 16);
  CHECK(code[0].item<float>() == -1.0F);
  CHECK(code[1].item<float>() == -0.6961928009986877F);
  CHECK(code[7].item<float>() == 0.0F);
  CHECK(code[8].item<float>() == 0.07958029955625534F);
  CHECK(code[14].item<float>() == 0.7229568362236023F);
  CHECK(code[15].item<float>() == 1.0F);
  CHECK(at::equal(std::get<0>(at::sort(code)), code));

  const at::Tensor map = loom::quant::dynamic_map();
  REQUIRE(map.scalar_type() == at::kFloat);
  REQUIRE(map.numel() == 256);
  CHECK(at::equal(std::get<0>(at::sort(map)), map));
  CHECK(map[0].item<float>() == -0.992968738079071F);
  CHECK(map[1].item<float>() == -0.9789062738418579F);
  CHECK(map[126].item<float>() == -5.500000384017767e-07F);
  CHECK(map[127].item<float>() == 0.0F);
  CHECK(map[129].item<float>() == 3.250000190746505e-06F);
  CHECK(map[254].item<float>() == 0.992968738079071F);
  CHECK(map[255].item<float>() == 1.0F);
}

TEST_CASE("nf4 packs two codes a byte, the first in the high nibble") {
  const at::Tensor values = at::tensor({1.0F, -1.0F, 0.0F});
  const auto weight = loom::quant::quantize_nf4(values, {.block_size = 64, .double_quant = false});
  CHECK(bytes_of(weight.packed) == std::vector<std::uint8_t>{0xF0, 0x77});  // the padding 0: code 7
  REQUIRE(weight.absmax.scalar_type() == at::kFloat);
  REQUIRE(weight.absmax.numel() == 1);
  CHECK(weight.absmax[0].item<float>() == 1.0F);
  CHECK_FALSE(weight.absmax_scale.defined());
  CHECK_FALSE(weight.absmax_offset.defined());
  const at::Tensor back =
      loom::quant::dequantize_nf4(weight, {3}, {.block_size = 64, .double_quant = false}, at::kFloat);
  CHECK(at::equal(back, values));
}

TEST_CASE("nf4 reproduces code-book multiples exactly and a value on a midpoint takes the lower code") {
  const at::Tensor code = loom::quant::nf4_code_book();
  const at::Tensor values = at::cat({code * 3.0, code.flip(0) * 3.0, at::zeros({32})}).reshape({2, 32});
  const nf4_options options{.block_size = 64, .double_quant = false};
  const auto weight = loom::quant::quantize_nf4(values, options);
  CHECK(at::equal(loom::quant::dequantize_nf4(weight, values.sizes(), options, at::kFloat), values));

  // (code[8] + code[9]) / 2 sits between codes 8 and 9: dQuantizeNF4 takes 8 (x > t is strict).
  const at::Tensor midpoint = ((code[8] + code[9]) / 2).reshape({1});
  const auto tie = loom::quant::quantize_nf4(at::cat({at::ones({1}), midpoint}), options);
  CHECK(bytes_of(tie.packed) == std::vector<std::uint8_t>{0xF8});
}

TEST_CASE("nf4 round trip stays within the code book's gaps") {
  for (const bool double_quant : {false, true}) {
    for (const std::int64_t block_size : {32, 64, 256}) {
      const at::Tensor values = random_normal({37, 129}, 7 + block_size) * 0.02;
      const nf4_options options{.block_size = block_size, .double_quant = double_quant};
      const auto weight = loom::quant::quantize_nf4(values, options);
      const std::int64_t blocks = (values.numel() + block_size - 1) / block_size;
      CHECK(weight.packed.numel() == (values.numel() + 1) / 2);
      CHECK(weight.absmax.numel() == blocks);
      if (double_quant) {
        CHECK(weight.absmax.scalar_type() == at::kByte);
        CHECK(weight.absmax_scale.numel() == (blocks + 255) / 256);
        CHECK(weight.absmax_offset.numel() == 1);
      }
      const at::Tensor back = loom::quant::dequantize_nf4(weight, values.sizes(), options, at::kFloat);
      REQUIRE(back.sizes() == values.sizes());
      // The widest gap of the code book is -1 to -0.6961928: half of it, of the block's absmax, and
      // under double quantization the absmax's own 8-bit error (under 1% for these blocks).
      const double bound = (1 - 0.6961928009986877) / 2 + (double_quant ? 0.01 : 1e-6);
      const at::Tensor error = (back - values).abs() / block_absmax_of(values, block_size);
      CHECK(error.max().item<double>() <= bound);
      // Most values sit far nearer their code than that.
      CHECK(error.mean().item<double>() < 0.05);
    }
  }
}

TEST_CASE("nf4 of bf16 and fp16 values is that of their fp32 values, and dequantizes to each dtype") {
  const at::Tensor values = random_normal({7, 97}, 3).to(at::kBFloat16);
  const auto from_bf16 = loom::quant::quantize_nf4(values);
  const auto from_fp32 = loom::quant::quantize_nf4(values.to(at::kFloat));
  CHECK(at::equal(from_bf16.packed, from_fp32.packed));
  CHECK(at::equal(from_bf16.absmax, from_fp32.absmax));
  CHECK(at::equal(from_bf16.absmax_scale, from_fp32.absmax_scale));
  CHECK(at::equal(from_bf16.absmax_offset, from_fp32.absmax_offset));
  const at::Tensor in_fp32 = loom::quant::dequantize_nf4(from_bf16, values.sizes(), {}, at::kFloat);
  for (const at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    const at::Tensor back = loom::quant::dequantize_nf4(from_bf16, values.sizes(), {}, dtype);
    CHECK(back.scalar_type() == dtype);
    CHECK(at::equal(back, in_fp32.to(dtype)));
  }
}

TEST_CASE("nf4 of zeros is code 7 and zeros back, in a whole block and a partial one") {
  const at::Tensor values = at::zeros({100});
  const nf4_options plain{.block_size = 64, .double_quant = false};
  const auto weight = loom::quant::quantize_nf4(values, plain);
  for (const std::uint8_t byte : bytes_of(weight.packed)) CHECK(byte == 0x77);
  CHECK(weight.absmax[0].item<float>() == 0.0F);
  CHECK(weight.absmax[1].item<float>() == 1e-38F);  // bitsandbytes' clamped partial block
  CHECK(at::equal(loom::quant::dequantize_nf4(weight, {100}, plain, at::kFloat), values));
  const auto nested = loom::quant::quantize_nf4(values);
  CHECK(at::equal(loom::quant::dequantize_nf4(nested, {100}, {}, at::kBFloat16), values.to(at::kBFloat16)));
  // Whole blocks of zeros: absmax 0, their mean 0, a statistics block of zeros, all code 0 (CUDA's and
  // bitsandbytes' CPU kernel's).
  const auto whole_blocks = loom::quant::quantize_nf4(at::zeros({128}));
  for (const std::uint8_t code : bytes_of(whole_blocks.absmax)) CHECK(code == 0);
  CHECK(whole_blocks.absmax_scale[0].item<float>() == 0.0F);
  CHECK(at::equal(loom::quant::dequantize_nf4(whole_blocks, {128}, {}, at::kFloat), at::zeros({128})));
}

TEST_CASE("nf4 dequantizes parts that are views of a larger storage") {
  const at::Tensor values = random_normal({3, 1000}, 11);
  const auto weight = loom::quant::quantize_nf4(values);
  const at::Tensor expected = loom::quant::dequantize_nf4(weight, values.sizes(), {}, at::kBFloat16);
  // One gathered buffer with the parts at odd offsets, as an all-gather leaves them.
  const at::Tensor storage = at::zeros({1 + weight.packed.numel() + 3 + weight.absmax.numel()}, at::kByte);
  storage.narrow(0, 1, weight.packed.numel()).copy_(weight.packed);
  storage.narrow(0, 4 + weight.packed.numel(), weight.absmax.numel()).copy_(weight.absmax);
  const at::Tensor scales = at::zeros({5}, at::kFloat);
  scales.narrow(0, 1, 1).copy_(weight.absmax_scale);
  scales.narrow(0, 3, 1).copy_(weight.absmax_offset);
  const loom::quant::nf4_weight views{storage.narrow(0, 1, weight.packed.numel()),
                                      storage.narrow(0, 4 + weight.packed.numel(), weight.absmax.numel()),
                                      scales.narrow(0, 1, 1), scales.narrow(0, 3, 1)};
  CHECK(at::equal(loom::quant::dequantize_nf4(views, values.sizes(), {}, at::kBFloat16), expected));
  // A strided packed view reads the same bytes.
  const at::Tensor strided = at::zeros({weight.packed.numel(), 2}, at::kByte);
  strided.select(1, 1).copy_(weight.packed);
  const loom::quant::nf4_weight with_strided{strided.select(1, 1), weight.absmax, weight.absmax_scale,
                                             weight.absmax_offset};
  CHECK(at::equal(loom::quant::dequantize_nf4(with_strided, values.sizes(), {}, at::kBFloat16), expected));
}

TEST_CASE("nf4 refuses what bitsandbytes refuses and parts that do not fit") {
  const at::Tensor values = random_normal({4, 64}, 5);
  CHECK_THROWS_WITH(loom::quant::quantize_nf4(at::ones({4}, at::kInt)), ContainsSubstring("bf16, fp16 or fp32"));
  CHECK_THROWS_WITH(loom::quant::quantize_nf4(values.to(at::kDouble)), ContainsSubstring("convert it first"));
  CHECK_THROWS_WITH(loom::quant::quantize_nf4(at::ones({0})), ContainsSubstring("empty"));
  CHECK_THROWS_WITH(loom::quant::quantize_nf4(values, {.block_size = 48}),
                    ContainsSubstring("block size 48 is not one bitsandbytes"));
  CHECK_THROWS_WITH(loom::quant::quantize_nf4(values, {.block_size = 8192}), ContainsSubstring("use 32, 64"));
  CHECK_THROWS_WITH(loom::quant::quantize_nf4(values, {.statistics_block_size = 32}),
                    ContainsSubstring("statistics block size 32"));
  CHECK_NOTHROW(loom::quant::quantize_nf4(values, {.double_quant = false, .statistics_block_size = 32}));
  CHECK_THROWS_AS(loom::quant::quantize_nf4(values, {.block_size = 48}), std::invalid_argument);

  const auto weight = loom::quant::quantize_nf4(values);
  CHECK_THROWS_WITH(
      loom::quant::dequantize_nf4(weight, {4, 65}, {}, at::kFloat),
      ContainsSubstring("packed is uint8 with 128 elements where the shape and options need uint8 [130]"));
  CHECK_THROWS_WITH(loom::quant::dequantize_nf4(weight, {4, 64}, {.double_quant = false}, at::kFloat),
                    ContainsSubstring("absmax is uint8"));
  CHECK_THROWS_WITH(loom::quant::dequantize_nf4(weight, {4, 64}, {.block_size = 128}, at::kFloat),
                    ContainsSubstring("absmax is uint8 with 4 elements"));
  CHECK_THROWS_WITH(loom::quant::dequantize_nf4(weight, {4, 64}, {}, at::kInt), ContainsSubstring("dtype Int"));
  auto missing = weight;
  missing.absmax_scale = at::Tensor();
  CHECK_THROWS_WITH(loom::quant::dequantize_nf4(missing, {4, 64}, {}, at::kFloat),
                    ContainsSubstring("absmax_scale is missing"));
  CHECK_THROWS_WITH(loom::quant::dequantize_nf4(weight, {0, 64}, {}, at::kFloat), ContainsSubstring("no elements"));
  CHECK_THROWS_WITH(loom::quant::dequantize_nf4(weight, {4, 64}, {.block_size = 100}, at::kFloat),
                    ContainsSubstring("block size 100"));
}

TEST_CASE("fp8 per row and per tensor against a hand computation") {
  const at::Tensor w = at::tensor({1.0F, -2.0F, 0.5F, 0.0F, 0.0F, 0.0F, 896.0F, 3.0F, -1.0F}).reshape({3, 3});
  const auto rows = loom::quant::quantize_fp8(w, fp8_scaling::row);
  REQUIRE(rows.values.scalar_type() == at::kByte);
  REQUIRE(rows.values.sizes() == w.sizes());
  REQUIRE(rows.scale.scalar_type() == at::kFloat);
  REQUIRE(rows.scale.numel() == 3);
  CHECK(rows.scale[0].item<float>() == 2.0F / 448.0F);
  CHECK(rows.scale[1].item<float>() == std::numeric_limits<float>::min());  // an all-zero row
  CHECK(rows.scale[2].item<float>() == 2.0F);
  // e4m3fn: 224 = 0x76, -448 = 0xFE, 112 = 0x6E; 448 = 0x7E, 1.5 = 0x3C, -0.5 = 0xB0.
  CHECK(bytes_of(rows.values) == std::vector<std::uint8_t>{0x76, 0xFE, 0x6E, 0, 0, 0, 0x7E, 0x3C, 0xB0});
  CHECK(at::equal(loom::quant::dequantize_fp8(rows, at::kFloat),
                  at::tensor({1.0F, -2.0F, 0.5F, 0.0F, 0.0F, 0.0F, 896.0F, 3.0F, -1.0F}).reshape({3, 3})));

  const auto whole = loom::quant::quantize_fp8(w, fp8_scaling::tensor);
  REQUIRE(whole.scale.numel() == 1);
  CHECK(whole.scale[0].item<float>() == 2.0F);
  // 0.5 = 0x30, -1 = 0xB8, 0.25 = 0x28.
  CHECK(bytes_of(whole.values) == std::vector<std::uint8_t>{0x30, 0xB8, 0x28, 0, 0, 0, 0x7E, 0x3C, 0xB0});
  CHECK(at::equal(loom::quant::dequantize_fp8(whole, at::kFloat), w));

  // 1.0625 lies halfway between e4m3's 1 and 1.125: to the even mantissa, 1.
  const auto tie = loom::quant::quantize_fp8(at::tensor({448.0F, 1.0625F}).reshape({1, 2}), fp8_scaling::row);
  CHECK(bytes_of(tie.values) == std::vector<std::uint8_t>{0x7E, 0x38});
}

TEST_CASE("fp8 per row keeps a small row's precision where per tensor loses it") {
  const at::Tensor w = at::stack({random_normal({256}, 1) * 1000, random_normal({256}, 2) * 1e-3});
  const auto rows = loom::quant::quantize_fp8(w, fp8_scaling::row);
  const auto whole = loom::quant::quantize_fp8(w, fp8_scaling::tensor);
  const at::Tensor small = w[1];
  const double row_error = (loom::quant::dequantize_fp8(rows, at::kFloat)[1] - small).abs().max().item<double>();
  const double tensor_error = (loom::quant::dequantize_fp8(whole, at::kFloat)[1] - small).abs().max().item<double>();
  CHECK(row_error <= small.abs().max().item<double>() / 16);  // e4m3: 3 mantissa bits
  CHECK(tensor_error > 10 * row_error);
  // A 3-D tensor's rows are its slices along dim 0.
  const at::Tensor cube = random_normal({4, 3, 5}, 9);
  const auto cube_rows = loom::quant::quantize_fp8(cube, fp8_scaling::row);
  CHECK(cube_rows.scale.numel() == 4);
  CHECK(at::equal(cube_rows.scale, cube.abs().amax({1, 2}) / 448.0F));
}

TEST_CASE("fp8 of bf16 values takes torchao's scale in bf16 and dequantizes to each dtype") {
  const at::Tensor w = (random_normal({8, 33}, 4) * 3).to(at::kBFloat16);
  const auto weight = loom::quant::quantize_fp8(w, fp8_scaling::row);
  // torchao: amax / 448 on the bf16 amax, rounded to bf16, then fp32.
  CHECK(at::equal(weight.scale, (w.abs().amax(1) / 448.0).to(at::kFloat)));
  const at::Tensor three = at::tensor({3.0F}).to(at::kBFloat16).reshape({1, 1});
  CHECK(loom::quant::quantize_fp8(three, fp8_scaling::tensor).scale[0].item<float>() == 0.006683349609375F);
  const at::Tensor back = loom::quant::dequantize_fp8(weight, at::kBFloat16);
  CHECK(back.scalar_type() == at::kBFloat16);
  CHECK(at::equal(back, loom::quant::dequantize_fp8(weight, at::kFloat).to(at::kBFloat16)));
  CHECK(((back.to(at::kFloat) - w.to(at::kFloat)).abs() / w.to(at::kFloat).abs().amax(1, true)).max().item<double>() <
        1.0 / 16 + 1.0 / 128);
}

TEST_CASE("fp8 refuses what it cannot quantize and parts that do not fit") {
  CHECK_THROWS_WITH(loom::quant::quantize_fp8(at::ones({2, 2}, at::kInt), fp8_scaling::row),
                    ContainsSubstring("bf16, fp16 or fp32"));
  CHECK_THROWS_WITH(loom::quant::quantize_fp8(at::ones({4}), fp8_scaling::row),
                    ContainsSubstring("row scaling needs rows, and the tensor has 1 dimension"));
  CHECK_NOTHROW(loom::quant::quantize_fp8(at::ones({4}), fp8_scaling::tensor));
  CHECK_THROWS_WITH(loom::quant::quantize_fp8(at::ones({0, 3}), fp8_scaling::tensor), ContainsSubstring("empty"));
  const auto weight = loom::quant::quantize_fp8(at::ones({4, 3}), fp8_scaling::row);
  CHECK_THROWS_WITH(loom::quant::dequantize_fp8({weight.values, at::ones({3})}, at::kFloat),
                    ContainsSubstring("the scale has 3 elements for values of shape [4, 3]"));
  CHECK_THROWS_WITH(loom::quant::dequantize_fp8({weight.values.to(at::kFloat), weight.scale}, at::kFloat),
                    ContainsSubstring("they should be uint8"));
  CHECK_THROWS_WITH(loom::quant::dequantize_fp8(weight, at::kLong), ContainsSubstring("dtype Long"));
}

// On a GPU (scripts/gpu-check runs this test there): quantizing and dequantizing on the device give
// the CPU's bytes and values, bit for bit; a quantized weight's product and the input's gradient are
// the dequantized weight's. Skipped without CUDA.
TEST_CASE("on CUDA, nf4 and fp8 give the CPU's bytes and values, and quant::linear the dequantized weight's product",
          "[cuda]") {
  if (!at::hasCUDA()) SKIP("no CUDA device");
  const at::Device cuda(at::kCUDA, 0);
  const at::Tensor values = at::randn({97, 131}, at::TensorOptions().dtype(at::kBFloat16)) * 3;
  for (const bool double_quant : {true, false}) {
    const loom::quant::nf4_options options{.double_quant = double_quant};
    const loom::quant::nf4_weight cpu = loom::quant::quantize_nf4(values, options);
    const loom::quant::nf4_weight gpu = loom::quant::quantize_nf4(values.to(cuda), options);
    CHECK(at::equal(gpu.packed.cpu(), cpu.packed));
    CHECK(at::equal(gpu.absmax.cpu(), cpu.absmax));
    const at::Tensor back = loom::quant::dequantize_nf4(gpu, values.sizes(), options, at::kBFloat16);
    CHECK(at::equal(back.cpu(), loom::quant::dequantize_nf4(cpu, values.sizes(), options, at::kBFloat16)));
  }
  for (const auto scaling : {loom::quant::fp8_scaling::row, loom::quant::fp8_scaling::tensor}) {
    const loom::quant::fp8_weight cpu = loom::quant::quantize_fp8(values, scaling);
    const loom::quant::fp8_weight gpu = loom::quant::quantize_fp8(values.to(cuda), scaling);
    CHECK(at::equal(gpu.values.cpu(), cpu.values));
    CHECK(at::equal(loom::quant::dequantize_fp8(gpu, at::kFloat).cpu(), loom::quant::dequantize_fp8(cpu, at::kFloat)));
  }
  const loom::quantized_options options{.format = loom::nf4};
  const auto weight = loom::quant::quantized_weight::quantize(values.to(cuda), options);
  const at::Tensor input = at::randn({5, 131}, at::TensorOptions().dtype(at::kBFloat16).device(cuda)).requires_grad_();
  const at::Tensor out = loom::quant::linear(input, weight, {});
  out.sum().backward();
  const at::Tensor dense = weight.dequantize(at::kBFloat16);
  CHECK(at::allclose(out.to(at::kFloat), at::matmul(input.detach(), dense.t()).to(at::kFloat), 1e-2, 1e-2));
  CHECK(at::allclose(input.grad().to(at::kFloat), at::ones({5, 97}, dense.options()).matmul(dense).to(at::kFloat), 1e-2,
                     1e-2));
}

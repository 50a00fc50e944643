#include <loom/quant/nf4.hpp>

#include <loom/base/text.hpp>

#include "dtype_name.hpp"

#include <fmt/ranges.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

namespace loom::quant {
namespace {

using detail::dtype_name;

// bitsandbytes' get_4bit_type("nf4") (and the CUDA kernel's nf4_dequantization_lut), as fp32.
constexpr std::array<float, 16> nf4_values = {
    -1.0F,
    -0.6961928009986877F,
    -0.5250730514526367F,
    -0.39491748809814453F,
    -0.28444138169288635F,
    -0.18477343022823334F,
    -0.09105003625154495F,
    0.0F,
    0.07958029955625534F,
    0.16093020141124725F,
    0.24611230194568634F,
    0.33791524171829224F,
    0.44070982933044434F,
    0.5626170039176941F,
    0.7229568362236023F,
    1.0F,
};

// bitsandbytes' PyTorch path clamps a block's absmax to this before dividing by it.
constexpr float smallest_absmax = 1e-38F;

bool is_power_of_two_within(std::int64_t value, std::int64_t low, std::int64_t high) {
  return value >= low && value <= high && (value & (value - 1)) == 0;
}

void check_options(const nf4_options& options, const char* function) {
  if (!is_power_of_two_within(options.block_size, 32, 4096)) {
    throw_error<std::invalid_argument>(
        "{}: block size {} is not one bitsandbytes' quantize_4bit takes; use 32, 64, 128, 256, 512, 1024, 2048 or "
        "4096 (64 is QLoRA's)",
        function, options.block_size);
  }
  if (options.double_quant && !is_power_of_two_within(options.statistics_block_size, 64, 4096)) {
    throw_error<std::invalid_argument>(
        "{}: statistics block size {} is not one bitsandbytes' quantize_blockwise takes; use 64, 128, 256, 512, "
        "1024, 2048 or 4096 (256 is quantize_4bit's)",
        function, options.statistics_block_size);
  }
}

bool is_nf4_dtype(at::ScalarType dtype) { return dtype == at::kBFloat16 || dtype == at::kHalf || dtype == at::kFloat; }

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// The code book, the dynamic map, their midpoints and the 256 byte → two values table, made once on
// the CPU and copied once to each device they are asked on.
struct tables {
  at::Tensor code_book;       // fp32 [16]
  at::Tensor nf4_bounds;      // fp32 [15]: (code[i] + code[i + 1]) / 2
  at::Tensor byte_values;     // fp32 [256, 2]: a byte's high nibble's value, then its low nibble's
  at::Tensor dynamic;         // fp32 [256]
  at::Tensor dynamic_bounds;  // fp32 [255]: (map[i] + map[i + 1]) * 0.5
};

tables make_cpu_tables() {
  c10::NoGradGuard no_grad;
  tables t;
  t.code_book = at::empty({16}, at::kFloat);
  std::copy(nf4_values.begin(), nf4_values.end(), t.code_book.data_ptr<float>());
  t.nf4_bounds = (t.code_book.narrow(0, 0, 15) + t.code_book.narrow(0, 1, 15)) / 2;
  const at::Tensor bytes = at::arange(256, at::kLong);
  t.byte_values = at::stack({t.code_book.index_select(0, at::bitwise_right_shift(bytes, 4)),
                             t.code_book.index_select(0, at::bitwise_and(bytes, 15))},
                            1)
                      .contiguous();
  // create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8): for exponent i, the means
  // of linspace(0.1, 1, 2^i + 1) (fp32) times 10^(i - 6), positive and negative; then 0 and 1, sorted.
  std::vector<at::Tensor> parts;
  for (int i = 0; i < 7; ++i) {
    const at::Tensor boundaries = at::linspace(0.1, 1, (std::int64_t{1} << i) + 1, at::kFloat);
    const std::int64_t count = boundaries.numel() - 1;
    const at::Tensor means = (boundaries.narrow(0, 0, count) + boundaries.narrow(0, 1, count)) / 2.0;
    const double power = std::pow(10.0, i - 6);  // Python's 10 ** (i - 6): 1e-06, ..., 1
    parts.push_back(means * power);
    parts.push_back(means * -power);
  }
  parts.push_back(at::zeros({1}, at::kFloat));
  parts.push_back(at::ones({1}, at::kFloat));
  t.dynamic = std::get<0>(at::sort(at::cat(parts)));
  t.dynamic_bounds = (t.dynamic.narrow(0, 0, 255) + t.dynamic.narrow(0, 1, 255)) * 0.5;
  return t;
}

const tables& cpu_tables() {
  static const tables t = make_cpu_tables();
  return t;
}

const tables& tables_on(const c10::Device& device) {
  if (device.is_cpu()) return cpu_tables();
  static std::mutex mutex;
  static std::map<std::pair<int, int>, tables> copies;
  const std::lock_guard lock(mutex);
  const std::pair key{static_cast<int>(device.type()), static_cast<int>(device.index())};
  auto found = copies.find(key);
  if (found != copies.end()) return found->second;
  const tables& cpu = cpu_tables();
  tables copy{cpu.code_book.to(device), cpu.nf4_bounds.to(device), cpu.byte_values.to(device), cpu.dynamic.to(device),
              cpu.dynamic_bounds.to(device)};
  return copies.emplace(key, std::move(copy)).first->second;
}

// `flat` padded with zeros to `length` (a view when it is that long already).
at::Tensor padded(const at::Tensor& flat, std::int64_t length) {
  if (flat.numel() == length) return flat;
  return at::constant_pad_nd(flat, {0, length - flat.numel()}, 0);
}

// bitsandbytes' quantize_blockwise(centred, code=dynamic map, blocksize) as its CUDA kernel does it:
// each block's absmax, and each value's nearest code of v * (1 / absmax) by dQuantize<0> (fp32
// midpoints, a value on a midpoint to the even code: dQuantize's final pivot); a zero block all code 0.
std::pair<at::Tensor, at::Tensor> quantize_statistics(const at::Tensor& centred, std::int64_t block_size,
                                                      const tables& t) {
  const std::int64_t count = centred.numel();
  const std::int64_t blocks = ceil_div(count, block_size);
  // Zeros pad the last block: they change neither its absmax nor its own values' codes.
  const at::Tensor grid = padded(centred, blocks * block_size).view({blocks, block_size});
  const at::Tensor absmax = grid.abs().amax(1);
  const at::Tensor scaled = (grid * at::reciprocal(absmax).unsqueeze(1)).reshape(-1).narrow(0, 0, count);
  at::Tensor code = at::bucketize(scaled, t.dynamic_bounds, /*out_int32=*/false, /*right=*/false);
  // bucketize puts a value on bounds[q] at q, the lower of (q, q + 1); dQuantize at the even one.
  const at::Tensor on_bound = at::logical_and(at::eq(scaled, t.dynamic_bounds.index_select(0, code.clamp_max(254))),
                                              at::eq(at::remainder(code, 2), 1));
  code = code + on_bound.to(at::kLong);
  const at::Tensor zero_block =
      at::eq(absmax, 0).unsqueeze(1).expand({blocks, block_size}).reshape(-1).narrow(0, 0, count);
  code = at::where(zero_block, at::zeros_like(code), code);
  return {code.to(at::kByte), absmax};
}

// The values' fp32 absmax per block, from the codes and statistics under double quantization.
at::Tensor block_absmax(const nf4_weight& weight, std::int64_t blocks, const nf4_options& options, const tables& t) {
  if (!options.double_quant) return weight.absmax.reshape(-1);
  const std::int64_t statistics = ceil_div(blocks, options.statistics_block_size);
  const at::Tensor scale = weight.absmax_scale.reshape({statistics, 1})
                               .expand({statistics, options.statistics_block_size})
                               .reshape(-1)
                               .narrow(0, 0, blocks);
  // bitsandbytes: dequantize_blockwise (code · absmax, fp32), then absmax += offset.
  const at::Tensor absmax = at::mul(t.dynamic.index_select(0, weight.absmax.reshape(-1).to(at::kLong)), scale);
  return at::add(absmax, weight.absmax_offset.reshape({1}));
}

// The CPU's dequantization: per block, the 16 values code · absmax cast to T once, then each byte's
// two nibbles looked up (the same numbers as the product per element: one fp32 product, one cast).
template <class T>
void dequantize_on_cpu(const std::uint8_t* packed, const float* absmax, T* out, std::int64_t count,
                       std::int64_t block_size) {
  const std::int64_t blocks = ceil_div(count, block_size);
  at::parallel_for(0, blocks, std::max<std::int64_t>(1, 16384 / block_size), [&](std::int64_t first, std::int64_t end) {
    std::array<T, 16> lut{};
    for (std::int64_t block = first; block < end; ++block) {
      const float scale = absmax[block];
      for (std::size_t k = 0; k < 16; ++k) lut[k] = static_cast<T>(nf4_values[k] * scale);
      const std::int64_t begin = block * block_size;  // even: block sizes are
      const std::int64_t stop = std::min(begin + block_size, count);
      const std::int64_t pairs = (stop - begin) / 2;
      const std::uint8_t* bytes = packed + begin / 2;
      T* target = out + begin;
      for (std::int64_t j = 0; j < pairs; ++j) {
        const std::uint8_t byte = bytes[j];
        target[2 * j] = lut[byte >> 4];
        target[2 * j + 1] = lut[byte & 15];
      }
      if ((stop - begin) % 2 != 0) target[2 * pairs] = lut[bytes[pairs] >> 4];
    }
  });
}

void check_part(const at::Tensor& part, const char* name, at::ScalarType dtype, std::int64_t numel, const char* what) {
  if (!part.defined()) {
    throw_error<std::invalid_argument>("loom::quant::dequantize_nf4: {} is missing; it should be {} [{}] ({})", name,
                                       dtype_name(dtype), numel, what);
  }
  if (part.scalar_type() != dtype || part.numel() != numel) {
    throw_error<std::invalid_argument>(
        "loom::quant::dequantize_nf4: {} is {} with {} elements where the shape and options need {} [{}] ({}); pass "
        "the parts quantize_nf4 made for this shape with these options",
        name, dtype_name(part.scalar_type()), part.numel(), dtype_name(dtype), numel, what);
  }
}

}  // namespace

at::Tensor nf4_code_book() { return cpu_tables().code_book.clone(); }

at::Tensor dynamic_map() { return cpu_tables().dynamic.clone(); }

nf4_weight quantize_nf4(const at::Tensor& values, const nf4_options& options) {
  if (!values.defined()) {
    throw_error<std::invalid_argument>(
        "loom::quant::quantize_nf4: the tensor is undefined; pass the values to quantize");
  }
  if (!is_nf4_dtype(values.scalar_type())) {
    throw_error<std::invalid_argument>(
        "loom::quant::quantize_nf4: the tensor is {}; NF4 quantizes bf16, fp16 or fp32 values (as bitsandbytes' "
        "quantize_4bit): convert it first",
        dtype_name(values.scalar_type()));
  }
  if (values.numel() == 0) {
    throw_error<std::invalid_argument>("loom::quant::quantize_nf4: the tensor is empty; there is nothing to quantize");
  }
  check_options(options, "loom::quant::quantize_nf4");
  c10::NoGradGuard no_grad;
  const tables& t = tables_on(values.device());
  const at::Tensor flat = values.detach().reshape(-1).to(at::kFloat);
  const std::int64_t count = flat.numel();
  const std::int64_t block_size = options.block_size;
  const std::int64_t full = count / block_size;
  const std::int64_t rest = count % block_size;

  // bitsandbytes' PyTorch path (backends/default/ops.py, quantize_4bit), step by step.
  std::vector<at::Tensor> absmax_parts;
  std::vector<at::Tensor> scaled_parts;
  if (full > 0) {
    const at::Tensor whole = flat.narrow(0, 0, full * block_size).view({full, block_size});
    const at::Tensor absmax = whole.abs().amax(1);
    absmax_parts.push_back(absmax);
    scaled_parts.push_back(
        at::clamp(whole * at::reciprocal(absmax.clamp_min(smallest_absmax)).unsqueeze(1), -1, 1).reshape(-1));
  }
  if (rest > 0) {
    const at::Tensor tail = flat.narrow(0, full * block_size, rest);
    const at::Tensor absmax = tail.abs().amax().clamp_min(smallest_absmax);
    absmax_parts.push_back(absmax.reshape({1}));
    scaled_parts.push_back(at::clamp(tail / absmax, -1, 1));
  }
  const at::Tensor absmax = absmax_parts.size() == 1 ? absmax_parts[0] : at::cat(absmax_parts);
  const at::Tensor scaled = scaled_parts.size() == 1 ? scaled_parts[0] : at::cat(scaled_parts);

  // dQuantizeNF4: the midpoints, a value on one to the lower code (bucketize, right=False). An odd
  // count's last byte codes a padding 0 in its low nibble: code 7, as both of bitsandbytes' paths.
  const at::Tensor codes = at::bucketize(padded(scaled, 2 * ceil_div(count, 2)), t.nf4_bounds, /*out_int32=*/true,
                                         /*right=*/false)
                               .to(at::kByte)
                               .view({-1, 2});
  nf4_weight weight;
  weight.packed = at::bitwise_or(at::bitwise_left_shift(codes.select(1, 0), 4), codes.select(1, 1)).contiguous();

  if (!options.double_quant) {
    weight.absmax = absmax.contiguous();
    return weight;
  }
  // compress_statistics: offset = absmax.mean(); quantize_blockwise(absmax - offset, blocksize=256).
  const at::Tensor offset = absmax.mean();
  auto [codes8, statistics_absmax] = quantize_statistics(absmax - offset, options.statistics_block_size, t);
  weight.absmax = codes8.contiguous();
  weight.absmax_scale = statistics_absmax.contiguous();
  weight.absmax_offset = offset.reshape({1}).contiguous();
  return weight;
}

at::Tensor dequantize_nf4(const nf4_weight& weight, at::IntArrayRef shape, const nf4_options& options,
                          at::ScalarType dtype) {
  check_options(options, "loom::quant::dequantize_nf4");
  if (!is_nf4_dtype(dtype)) {
    throw_error<std::invalid_argument>(
        "loom::quant::dequantize_nf4: dtype {} is not one NF4 dequantizes to; ask for bf16, fp16 or fp32",
        dtype_name(dtype));
  }
  std::int64_t count = 1;
  for (const std::int64_t size : shape) {
    if (size < 0) {
      throw_error<std::invalid_argument>(
          "loom::quant::dequantize_nf4: shape {} has a negative size; pass the shape "
          "the values had",
          fmt::join(shape, ", "));
    }
    count *= size;
  }
  if (count == 0) {
    throw_error<std::invalid_argument>("loom::quant::dequantize_nf4: shape [{}] has no elements; NF4 holds none",
                                       fmt::join(shape, ", "));
  }
  const std::int64_t blocks = ceil_div(count, options.block_size);
  check_part(weight.packed, "packed", at::kByte, ceil_div(count, 2), "two codes a byte");
  if (options.double_quant) {
    check_part(weight.absmax, "absmax", at::kByte, blocks, "one 8-bit code a block, under double quantization");
    check_part(weight.absmax_scale, "absmax_scale", at::kFloat, ceil_div(blocks, options.statistics_block_size),
               "one a statistics block");
    check_part(weight.absmax_offset, "absmax_offset", at::kFloat, 1, "the absmax's mean");
  } else {
    check_part(weight.absmax, "absmax", at::kFloat, blocks, "one a block, without double quantization");
  }
  c10::NoGradGuard no_grad;
  const c10::Device device = weight.packed.device();
  const tables& t = tables_on(device);
  nf4_weight parts{weight.packed, weight.absmax.to(device), {}, {}};
  if (options.double_quant) {
    parts.absmax_scale = weight.absmax_scale.to(device);
    parts.absmax_offset = weight.absmax_offset.to(device);
  }
  const at::Tensor absmax = block_absmax(parts, blocks, options, t).contiguous();

  if (device.is_cpu()) {
    const at::Tensor packed = weight.packed.reshape(-1).contiguous();
    at::Tensor out = at::empty({count}, at::TensorOptions().dtype(dtype));
    const auto* bytes = packed.data_ptr<std::uint8_t>();
    const auto* scales = absmax.data_ptr<float>();
    switch (dtype) {
      case at::kBFloat16:
        dequantize_on_cpu(bytes, scales, out.data_ptr<c10::BFloat16>(), count, options.block_size);
        break;
      case at::kHalf: dequantize_on_cpu(bytes, scales, out.data_ptr<c10::Half>(), count, options.block_size); break;
      default: dequantize_on_cpu(bytes, scales, out.data_ptr<float>(), count, options.block_size); break;
    }
    return out.view(shape);
  }
  // Elsewhere ATen's: each byte's two values from the byte table (the blocks' bytes padded to whole
  // blocks), times the block's absmax in fp32, cast to dtype as it is written.
  const std::int64_t length = blocks * options.block_size;
  const at::Tensor bytes = padded(weight.packed.reshape(-1), length / 2).to(at::kInt);
  const at::Tensor pairs = t.byte_values.index_select(0, bytes).view({blocks, options.block_size});
  at::Tensor out = at::empty({blocks, options.block_size}, pairs.options().dtype(dtype));
  at::mul_out(out, pairs, absmax.unsqueeze(1));
  return out.view(-1).narrow(0, 0, count).view(shape);
}

}  // namespace loom::quant

// quant-vs-bitsandbytes's loom side: reads the script's inputs (a safetensors file), quantizes and
// dequantizes each with loom, and writes the parts and values back for the script to compare.
//   quant-parity <inputs.safetensors> <outputs.safetensors>
// An input "<name>" with metadata "<name>.block_size" and "<name>.double_quant" is quantized to NF4;
// one whose metadata has "<name>.fp8" = "row" or "tensor" to fp8. Outputs: <name>.packed, .absmax,
// .absmax_scale, .absmax_offset and .values (dequantized in the input's dtype) for NF4; <name>.fp8_values,
// .fp8_scale and .values for fp8; "nf4_code_book" and "dynamic_map".
#include <loom/io/safetensors.hpp>
#include <loom/quant/fp8.hpp>
#include <loom/quant/nf4.hpp>

#include <ATen/ATen.h>

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: quant-parity <inputs.safetensors> <outputs.safetensors>\n");
    return 2;
  }
  try {
    const loom::safetensors_content inputs = loom::load_safetensors(argv[1]);
    std::vector<loom::named_tensor> outputs;
    outputs.push_back({"nf4_code_book", loom::quant::nf4_code_book()});
    outputs.push_back({"dynamic_map", loom::quant::dynamic_map()});
    for (const loom::named_tensor& input : inputs.tensors) {
      const std::string& name = input.name;
      const at::Tensor& values = input.tensor;
      if (const auto fp8 = inputs.metadata.find(name + ".fp8"); fp8 != inputs.metadata.end()) {
        const auto scaling = fp8->second == "row" ? loom::quant::fp8_scaling::row : loom::quant::fp8_scaling::tensor;
        const auto weight = loom::quant::quantize_fp8(values, scaling);
        outputs.push_back({name + ".fp8_values", weight.values});
        outputs.push_back({name + ".fp8_scale", weight.scale});
        outputs.push_back({name + ".values", loom::quant::dequantize_fp8(weight, values.scalar_type())});
        continue;
      }
      const loom::quant::nf4_options options{.block_size = std::stoll(inputs.metadata.at(name + ".block_size")),
                                             .double_quant = inputs.metadata.at(name + ".double_quant") == "1"};
      const auto weight = loom::quant::quantize_nf4(values, options);
      outputs.push_back({name + ".packed", weight.packed});
      outputs.push_back({name + ".absmax", weight.absmax});
      if (options.double_quant) {
        outputs.push_back({name + ".absmax_scale", weight.absmax_scale});
        outputs.push_back({name + ".absmax_offset", weight.absmax_offset});
      }
      outputs.push_back(
          {name + ".values", loom::quant::dequantize_nf4(weight, values.sizes(), options, values.scalar_type())});
    }
    loom::save_safetensors(argv[2], outputs);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "quant-parity: %s\n", error.what());
    return 1;
  }
  return 0;
}

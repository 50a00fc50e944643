// A Wan whose base is held in fp8 (quantized(loom::fp8): e4m3, a scale per row), for
// tests/models/wan_fp8_vs_diffusers.py:
//   wan-fp8-parity FOLDER {local|ddp|fsdp} OUT
// builds what the benchmark's fp8 Wan builds on FOLDER (a diffusers checkpoint in bf16):
//   model | seeded | default_dtype(bf16) | pretrained(FOLDER) | quantized(fp8) |
//   lora(4, {to_q, to_k, to_v, to_out.0}) | mixed_precision({.param = bf16}) | strategy
// runs the forward on FOLDER/inputs.safetensors' latents and text (in bf16, as diffusers' pipeline
// runs) and timestep, and writes on rank 0 OUT/output.safetensors (the velocity, in fp32) and
// OUT/quantized.txt (the layers quantized(...) holds in fp8, one a line), which the driver dequantizes
// by torchao's formula itself and gives diffusers.
// cast_forward_inputs = false: under fsdp() its default (FSDP2's) casts every floating input to bf16,
// Wan's float timestep too, and a timestep of ~1000 in bf16 (steps of 4 to 8) moves the velocity by
// 0.30 rms, 20 times the bound (#60: found by this check; diffusers' pipeline passes float timesteps).
#include "named_tensor.hpp"

#include <loom/io/safetensors.hpp>
#include <loom/loom.hpp>
#include <loom/models/wan.hpp>
#include <loom/quant/quantized_weight.hpp>

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace {

using loom::testing::named;

namespace fs = std::filesystem;

template <class Plan>
void run(const Plan& plan, const fs::path& folder, const fs::path& out) {
  auto job = loom::build(plan, loom::runtime::from_env());
  if (job.rt().rank() == 0) fmt::print("{}\n", job.describe());
  const std::vector<loom::named_tensor> inputs = loom::load_safetensors(folder / "inputs.safetensors").tensors;
  at::Tensor output;
  {
    const torch::NoGradGuard no_grad;
    output = job.forward(named(inputs, "latents").to(at::kBFloat16), named(inputs, "timestep"),
                         named(inputs, "text").to(at::kBFloat16))
                 .to(at::kFloat);
  }
  if (job.rt().rank() != 0) return;
  fs::create_directories(out);
  loom::save_safetensors(out / "output.safetensors", {{"output", output}});
  std::ofstream layers(out / "quantized.txt");
  const std::string suffix = "." + std::string(loom::quant::quantized_weight::codes_name);
  for (const auto& item : job.module()->named_parameters()) {
    if (item.key().ends_with(suffix)) layers << item.key().substr(0, item.key().size() - suffix.size()) << '\n';
  }
}

template <class Plan>
void with_strategy(const Plan& plan, std::string_view strategy, const fs::path& folder, const fs::path& out) {
  if (strategy == "local") return run(plan | loom::local(), folder, out);
  if (strategy == "ddp") return run(plan | loom::ddp(), folder, out);
  if (strategy == "fsdp") return run(plan | loom::fsdp(), folder, out);
  throw std::invalid_argument(fmt::format("unknown strategy '{}': local, ddp or fsdp", strategy));
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string_view> words(argv + 1, argv + argc);
  if (words.size() != 3) {
    fmt::print(stderr, "usage: wan-fp8-parity FOLDER {{local|ddp|fsdp}} OUT\n");
    return 2;
  }
  try {
    const fs::path folder(words[0]);
    const auto config = loom::models::wan_config::from_pretrained(folder);
    const auto plan = loom::model<loom::models::Wan>(config) | loom::seeded(0) | loom::default_dtype(loom::bf16) |
                      loom::pretrained(folder.string()) | loom::quantized(loom::fp8) |
                      loom::lora(4, {"to_q", "to_k", "to_v", "to_out.0"}) |
                      loom::mixed_precision({.param = loom::bf16, .cast_forward_inputs = false});
    with_strategy(plan, words[1], folder, fs::path(words[2]));
    return 0;
  } catch (const std::exception& error) {
    fmt::print(stderr, "wan-fp8-parity: {}\n", error.what());
    return 1;
  }
}

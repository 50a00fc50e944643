// loom's Wan fine-tuned with LoRA on a diffusers checkpoint, and the files diffusers and PEFT load
// (tests/models/wan_adapters_vs_diffusers.py makes the checkpoint and loads what this writes):
//   wan-adapter FOLDER OUT {local|fsdp}
// reads FOLDER/config.json, builds the plan with pretrained(FOLDER) and lora(4, {to_q, to_k, to_v,
// to_out.0}, {.alpha = 8}) (an alpha other than the rank, which diffusers would guess from the
// shapes), trains a few AdamW steps toward random velocities, each rank on latents of its own (LoRA's
// B starts at zero: untrained, the adapters add nothing), then writes
//   OUT/diffusers  save_adapter(..., adapter_format::diffusers): pytorch_lora_weights.safetensors
//   OUT/peft       save_adapter(...): PEFT's folder
//   OUT/merged     merge(), then save_pretrained(...): diffusion_pytorch_model.safetensors, config.json
//   OUT/merged-sharded  the same in shards of at most 16 KiB, with diffusers' index
//   OUT/outputs.safetensors  the velocity for FOLDER/inputs.safetensors' latents, timestep and text,
//                  adapted and merged.
// Here first: each saved adapter, loaded into a job built afresh, gives the adapted velocity bit for
// bit, and the merged velocity equals the adapted one within 1e-5 of its largest magnitude.
#include "named_tensor.hpp"

#include <loom/io/safetensors.hpp>
#include <loom/loom.hpp>
#include <loom/models/wan.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/optim/adamw.h>
#include <torch/torch.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <string_view>
#include <vector>

namespace {

using loom::testing::named;

namespace fs = std::filesystem;

constexpr double fp32_tolerance = 1e-5;
constexpr int training_steps = 3;
constexpr std::int64_t small_shard_bytes = 16 * 1024;

struct inputs {
  at::Tensor latents, timestep, text;
};

at::Tensor velocity_of(auto& job, const inputs& in) {
  torch::NoGradGuard no_grad;
  return job.forward(in.latents, in.timestep, in.text);
}

// Inputs shaped as `like`, drawn from `seed`, with timesteps anywhere in [0, 1000).
inputs drawn(const inputs& like, std::uint64_t seed) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  return {torch::randn(like.latents.sizes(), generator), torch::rand(like.timestep.sizes(), generator) * 1000,
          torch::randn(like.text.sizes(), generator)};
}

void train(auto& job, const inputs& like) {
  torch::optim::AdamW optimizer(job.trainable_parameters(), torch::optim::AdamWOptions(1e-2));
  for (int step = 0; step < training_steps; ++step) {
    const std::uint64_t seed = 1000 * static_cast<std::uint64_t>(step) + static_cast<std::uint64_t>(job.rt().rank());
    const inputs batch = drawn(like, seed);
    const at::Tensor velocity = job.forward(batch.latents, batch.timestep, batch.text);
    auto generator = at::make_generator<at::CPUGeneratorImpl>(seed + 500);
    job.backward((velocity - torch::randn(velocity.sizes(), generator)).square().mean());
    optimizer.step();
    job.zero_grad();
  }
}

bool report(const auto& job, std::string_view what, const at::Tensor& output, const at::Tensor& reference,
            double allowed) {
  const double difference = (output - reference).abs().max().item<double>();
  const bool within = difference <= allowed;
  fmt::print("rank {}: {}: largest difference {:.2e}: {} {:.2e}\n", job.rt().rank(), what, difference,
             within ? "within" : "BEYOND", allowed);
  return within;
}

template <class Plan>
bool run(const Plan& plan, const fs::path& folder, const fs::path& out) {
  const std::vector<loom::named_tensor> given = loom::load_safetensors(folder / "inputs.safetensors").tensors;
  const inputs fixed{named(given, "latents"), named(given, "timestep"), named(given, "text")};
  auto job = loom::build(plan, loom::runtime::from_env());
  train(job, fixed);
  const at::Tensor adapted = velocity_of(job, fixed);
  job.save_adapter(out / "diffusers", loom::adapter_format::diffusers);
  job.save_adapter(out / "peft");

  auto reloaded = loom::build(plan, job.rt());  // the same process group
  reloaded.load_adapter(out / "diffusers", loom::adapter_format::diffusers);
  bool ok = report(job, "diffusers' file loaded back, against the adapted velocity", velocity_of(reloaded, fixed),
                   adapted, 0);
  reloaded.load_adapter(out / "peft");
  ok &=
      report(job, "PEFT's folder loaded back, against the adapted velocity", velocity_of(reloaded, fixed), adapted, 0);

  job.merge();
  const at::Tensor merged = velocity_of(job, fixed);
  ok &= report(job, "merged against adapted", merged, adapted, fp32_tolerance * adapted.abs().max().item<double>());
  job.save_pretrained(out / "merged");
  job.save_pretrained(out / "merged-sharded", small_shard_bytes);
  if (job.rt().rank() == 0) {
    loom::save_safetensors(out / "outputs.safetensors", {{"adapted", adapted}, {"merged", merged}});
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string_view> words(argv + 1, argv + argc);
  if (words.size() != 3) {
    fmt::print(stderr, "usage: wan-adapter FOLDER OUT {{local|fsdp}}\n");
    return 2;
  }
  const fs::path folder = words[0];
  const fs::path out = words[1];
  try {
    const auto plan = loom::model<loom::models::Wan>(loom::models::wan_config::from_pretrained(folder)) |
                      loom::seeded(0) | loom::pretrained(folder.string()) |
                      loom::lora(4, {"to_q", "to_k", "to_v", "to_out.0"}, {.alpha = 8});
    if (words[2] == "local") return run(plan | loom::local(), folder, out) ? 0 : 1;
    if (words[2] == "fsdp") return run(plan | loom::fsdp(), folder, out) ? 0 : 1;
    fmt::print(stderr, "wan-adapter: unknown strategy '{}': local or fsdp\n", words[2]);
    return 2;
  } catch (const std::exception& error) {
    fmt::print(stderr, "wan-adapter: {}\n", error.what());
    return 1;
  }
}

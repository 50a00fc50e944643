// loom's Euler flow-matching sampler over loom's Wan on a diffusers checkpoint
// (tests/models/wan_sampler_vs_diffusers.py makes it and checks what this writes):
//   wan-sampler FOLDER {local|ddp|fsdp} OUT [--bf16-io]
// reads FOLDER/inputs.safetensors (noise, text, negative, and the sampler's steps, shift, guidance
// scale, the low-noise expert's guidance scale and the boundary; the last two 0 for one model) and the
// model: a transformer's folder (config.json), or a pipeline's of two experts (model_index.json:
// loom::models::WanExperts, which takes the expert by the timestep). It samples with
// loom::flow_euler_sampler, the model being the job's forward, and on rank 0 writes OUT: every model
// call's inputs and output in order (call.N.x, .t, .negative, .velocity) and the latents. With
// --bf16-io the model takes and gives bf16 (the job runs in fp32 between the casts), as a pipeline in
// bf16 does: the sampler's casts are then checked too.
#include "named_tensor.hpp"

#include <loom/io/safetensors.hpp>
#include <loom/loom.hpp>
#include <loom/models/wan.hpp>
#include <loom/models/wan_experts.hpp>
#include <loom/train/euler_sampler.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <optional>
#include <string_view>
#include <vector>

namespace {

using loom::testing::named;

namespace fs = std::filesystem;

struct arguments {
  fs::path folder;
  std::string_view strategy;
  fs::path out;
  bool bf16_io = false;
};

template <class Plan>
void sample(const Plan& plan, const arguments& args) {
  auto job = loom::build(plan, loom::runtime::from_env());
  const std::vector<loom::named_tensor> inputs = loom::load_safetensors(args.folder / "inputs.safetensors").tensors;
  // steps, shift, guidance scale, the low-noise expert's guidance scale, boundary (fp64)
  const at::Tensor settings = named(inputs, "settings");
  const double boundary_ratio = settings[4].item<double>();
  const loom::flow_euler_sampler sampler(
      {.num_inference_steps = static_cast<std::int64_t>(settings[0].item<double>()),
       .shift = settings[1].item<double>(),
       .guidance_scale = settings[2].item<double>(),
       .guidance_scale_2 = boundary_ratio > 0 ? std::optional(settings[3].item<double>()) : std::nullopt,
       .boundary_ratio = boundary_ratio});
  const at::Tensor negative = named(inputs, "negative");
  const at::ScalarType io = args.bf16_io ? at::kBFloat16 : at::kFloat;
  std::vector<loom::named_tensor> written;
  const auto model = [&](const at::Tensor& x, const at::Tensor& t, const at::Tensor& text) {
    const at::Tensor velocity = job.forward(x.to(at::kFloat), t, text).to(io);
    const std::string call = fmt::format("call.{}.", written.size() / 4);
    written.push_back({call + "x", x.clone()});
    written.push_back({call + "t", t.clone()});
    written.push_back({call + "negative", at::tensor({text.is_same(negative) ? 1 : 0})});
    written.push_back({call + "velocity", velocity.clone()});
    return velocity;
  };
  const at::Tensor latents = sampler.sample(model, named(inputs, "noise"), named(inputs, "text"), negative, io);
  written.push_back({"latents", latents.contiguous()});
  if (job.rt().rank() == 0) loom::save_safetensors(args.out, written);
  fmt::print("rank {}: {} {}: {} model calls, latents {}\n", job.rt().rank(), args.strategy,
             args.bf16_io ? "bf16 io" : "fp32", written.size() / 4, fmt::join(latents.sizes(), "x"));
}

template <class Plan>
void with_strategy(const Plan& plan, const arguments& args) {
  if (args.strategy == "local") return sample(plan | loom::local(), args);
  if (args.strategy == "ddp") return sample(plan | loom::ddp(), args);
  if (args.strategy == "fsdp") return sample(plan | loom::fsdp(), args);
  throw std::invalid_argument(fmt::format("unknown strategy '{}': local, ddp or fsdp", args.strategy));
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string_view> words(argv + 1, argv + argc);
  if (words.size() < 3 || words.size() > 4 || (words.size() == 4 && words[3] != "--bf16-io")) {
    fmt::print(stderr, "usage: wan-sampler FOLDER {{local|ddp|fsdp}} OUT [--bf16-io]\n");
    return 2;
  }
  const arguments args{.folder = words[0], .strategy = words[1], .out = words[2], .bf16_io = words.size() == 4};
  try {
    const auto pretrained = loom::pretrained(args.folder.string());
    if (fs::exists(args.folder / "model_index.json")) {
      const auto config = loom::models::wan_experts_config::from_pretrained(args.folder);
      with_strategy(loom::model<loom::models::WanExperts>(config) | loom::seeded(0) | pretrained, args);
    } else {
      const auto config = loom::models::wan_config::from_pretrained(args.folder);
      with_strategy(loom::model<loom::models::Wan>(config) | loom::seeded(0) | pretrained, args);
    }
    return 0;
  } catch (const std::exception& error) {
    fmt::print(stderr, "wan-sampler: {}\n", error.what());
    return 1;
  }
}

#pragma once
// loom::models::WanExperts: Wan 2.2 T2V-A14B, two Wan transformers of one shape in one model, as
// diffusers' WanPipeline holds them: `transformer`, the high-noise expert, denoises the timesteps at
// or above boundary_ratio · num_train_timesteps, and `transformer_2`, the low-noise expert, those
// below. Each expert is a loom::nn::Branch: a pass runs one, and under fsdp() it issues that
// expert's collectives alone. docs/models.md, "Wan 2.2 A14B: two experts".
//
//   const std::string folder = "Wan2.2-T2V-A14B-Diffusers/";  // model_index.json, transformer/, transformer_2/
//   const auto config = loom::models::wan_experts_config::from_pretrained(folder);
//   auto job = loom::build(loom::model<loom::models::WanExperts>(config) | loom::pretrained(folder) | loom::fsdp(),
//   rt); const at::Tensor velocity = job.forward(latents, timestep, text);  // the expert WanPipeline would take
//   job.forward(latents, timestep, text, loom::noise_expert::low_noise);  // a training step's expert
//
// pretrained(folder) reads each expert from its component's folder (pretrained_components): the
// parameter transformer_2.blocks.0.attn1.to_q.weight is blocks.0.attn1.to_q.weight of
// transformer_2/diffusion_pytorch_model*.safetensors. job.save_adapter(folder, format) writes one
// adapter an expert, in folder/transformer/ and folder/transformer_2/, each as diffusers and PEFT
// load it into that WanTransformer3DModel; job.load_adapter reads both back.

#include <loom/dsl/noise_expert.hpp>
#include <loom/dsl/targets.hpp>
#include <loom/models/wan.hpp>
#include <loom/nn/branch.hpp>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string_view>

namespace loom::models {

// A Wan 2.2 A14B pipeline's folder, as diffusers saves it: what the two experts are and where the
// timesteps split between them.
struct wan_experts_config {
  wan_config transformer, transformer_2;
  double boundary_ratio = 0.875;            // model_index.json's; A14B T2V's value
  std::int64_t num_train_timesteps = 1000;  // scheduler/scheduler_config.json's

  // WanPipeline's boundary_timestep: boundary_ratio · num_train_timesteps.
  [[nodiscard]] double boundary_timestep() const noexcept {
    return boundary_ratio * static_cast<double>(num_train_timesteps);
  }

  // Reads `pipeline_folder`/model_index.json's boundary_ratio, transformer/config.json and
  // transformer_2/config.json (wan_config::from_pretrained) and scheduler/scheduler_config.json's
  // num_train_timesteps (1000 when the file or the key is absent). Throws std::invalid_argument in one
  // sentence naming the file: no boundary_ratio (a pipeline of one transformer: loom::models::Wan reads
  // it), a ratio outside (0, 1), a num_train_timesteps that is not a positive whole number, and what
  // wan_config refuses of either transformer.
  [[nodiscard]] static wan_experts_config from_pretrained(const std::filesystem::path& pipeline_folder);
};

class WanExpertsImpl : public torch::nn::Module {
 public:
  // Throws std::invalid_argument for a ratio outside (0, 1), a num_train_timesteps below 1, and what
  // Wan refuses of either config.
  explicit WanExpertsImpl(const wan_experts_config& config);

  // The velocity of the expert WanPipeline takes for `timestep` (Wan's forward): the high-noise one
  // where the timestep, in fp32 as the pipeline compares its scheduler's timesteps, is at or above
  // boundary_timestep() (narrowed to fp32), the low-noise one below. The timesteps are read on the
  // host; every sample's (or, [B, S], every token's) must fall on one side, else std::invalid_argument
  // naming both: give the expert then. Under fsdp() every rank must take the same expert, which the
  // pass checks as it enters it (loom/nn/branch.hpp): with each rank's own timesteps, give it.
  at::Tensor forward(const at::Tensor& latents, const at::Tensor& timestep, const at::Tensor& text);
  // The velocity of `expert`, whatever the timesteps, with nothing read on the host: a training step's,
  // whose expert every rank chose alike (loom::flow_matching::expert_for_step).
  at::Tensor forward(const at::Tensor& latents, const at::Tensor& timestep, const at::Tensor& text,
                     noise_expert expert);

  // The expert WanPipeline takes for a timestep, compared as it compares them (in fp32).
  [[nodiscard]] noise_expert expert_for(float timestep) const noexcept;
  [[nodiscard]] double boundary_timestep() const noexcept { return config.boundary_timestep(); }

  // Where pretrained(folder) reads each expert: folder/<component>/, its names under "<component>.".
  static constexpr std::array<std::string_view, 2> pretrained_components{"transformer", "transformer_2"};
  // Each expert's adapter file keys its tensors under "transformer.", the name WanLoraLoaderMixin's
  // load_lora_weights takes them under for either transformer (load_into_transformer_2 picks which);
  // each expert's PEFT folder is a WanTransformer3DModel's.
  static constexpr std::string_view diffusers_component = WanImpl::diffusers_component;
  static constexpr std::string_view peft_base_model_class = WanImpl::peft_base_model_class;
  static constexpr std::string_view peft_parent_library = WanImpl::peft_parent_library;
  static constexpr auto lora_target_aliases = WanImpl::lora_target_aliases;
  static constexpr auto unquantized_modules = WanImpl::unquantized_modules;
  // No tensor_parallel_plan: tensor_parallel's exchanges are checked in one order in every pass, over
  // every branch, so build() refuses it for a model with branches.

  wan_experts_config config;
  std::shared_ptr<loom::nn::Branch<WanImpl>> transformer;    // the high-noise expert
  std::shared_ptr<loom::nn::Branch<WanImpl>> transformer_2;  // the low-noise expert
};
TORCH_MODULE(WanExperts);

}  // namespace loom::models

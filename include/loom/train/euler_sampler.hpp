#pragma once
// The Euler flow-matching sampler, as diffusers' FlowMatchEulerDiscreteScheduler and WanPipeline's
// loop run it (docs/training.md, "Validation"): from noise x at σ = 1, each of the steps predicts
// the velocity v̂ at (x, t) and moves x by (σ_next − σ) v̂; with classifier-free guidance the
// prediction is v̂_uncond + scale · (v̂_text − v̂_uncond), the unconditional one from the negative
// prompt's text states. For two experts (Wan 2.2 A14B's), the steps below the boundary are the
// low-noise expert's and guided by guidance_scale_2, as WanPipeline's loop switches them; the model
// called chooses its expert by the timestep.
//
//   const loom::flow_euler_sampler sampler({.num_inference_steps = 50, .shift = 3, .guidance_scale = 5});
//   at::Tensor latents = sampler.sample(
//       [&](const at::Tensor& x, const at::Tensor& t, const at::Tensor& text) { return job.forward(x, t, text); },
//       noise, text, negative_text, at::kBFloat16);
//
// The levels, the guidance and each step are computed in diffusers' dtypes and order of operations,
// so that over the same model the latents are diffusers', bit for bit.

#include <loom/dsl/options.hpp>
#include <loom/train/lr_schedule.hpp>  // option_problem

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace loom {

// FastVideo's validation names: validation_sampling_steps, the pipeline's flow_shift and
// validation_guidance_scale; guidance_scale_2 and boundary_ratio are WanPipeline's and FastVideo's
// sampling parameters' names.
struct flow_euler_sampler_options {
  std::int64_t num_inference_steps = 50;
  double shift = 3.0;
  double guidance_scale = 5.0;  // at most 1: no guidance (one model call a step), for either expert
  std::int64_t num_train_timesteps = 1000;
  // The low-noise expert's scale, for the steps below boundary_ratio; none: guidance_scale.
  std::optional<double> guidance_scale_2{};
  // Where two experts switch (the pipeline's model_index.json's); 0: one model.
  double boundary_ratio = 0;

  static constexpr auto fields() {
    return std::tuple{option_field{"num_inference_steps", &flow_euler_sampler_options::num_inference_steps},
                      option_field{"shift", &flow_euler_sampler_options::shift},
                      option_field{"guidance_scale", &flow_euler_sampler_options::guidance_scale},
                      option_field{"num_train_timesteps", &flow_euler_sampler_options::num_train_timesteps},
                      option_field{"guidance_scale_2", &flow_euler_sampler_options::guidance_scale_2},
                      option_field{"boundary_ratio", &flow_euler_sampler_options::boundary_ratio}};
  }
  // The first field out of range, if any.
  [[nodiscard]] std::optional<option_problem> problem() const;
  [[nodiscard]] std::string describe() const;
};

class flow_euler_sampler {
 public:
  // The model's velocity at latents `x` (in the model's dtype), timesteps `t` ([B], fp32) and text
  // states `text`.
  using velocity_model = std::function<at::Tensor(const at::Tensor& x, const at::Tensor& t, const at::Tensor& text)>;

  // Throws std::invalid_argument naming the first option out of range.
  explicit flow_euler_sampler(const flow_euler_sampler_options& options);

  [[nodiscard]] const flow_euler_sampler_options& options() const noexcept { return options_; }
  // The steps' levels σ, fp32, num_inference_steps of them then 0, and their timesteps σ · N (fp32):
  // set_timesteps' with shift, the shifted schedule's ends spaced evenly then shifted again.
  [[nodiscard]] const at::Tensor& sigmas() const noexcept { return sigmas_; }
  [[nodiscard]] const at::Tensor& timesteps() const noexcept { return timesteps_; }
  // Guidance is on for every step or none, by guidance_scale alone, as WanPipeline decides it.
  [[nodiscard]] bool guided() const noexcept { return options_.guidance_scale > 1; }
  // Each step's guidance scale: guidance_scale_2 at the low-noise expert's steps (timestep below
  // boundary_ratio · num_train_timesteps, compared in fp32), guidance_scale at the others.
  [[nodiscard]] const std::vector<double>& guidance_scales() const noexcept { return guidance_scales_; }

  // Samples from `noise` [B, ...] (fp32, at σ = 1) with `text` and, when guided, `negative_text`
  // states, the model called in `model_dtype`. Returns the latents in the model's output dtype, as
  // the scheduler's step casts them. Runs on the noise's device; reads nothing on the host.
  [[nodiscard]] at::Tensor sample(const velocity_model& model, const at::Tensor& noise, const at::Tensor& text,
                                  const at::Tensor& negative_text, at::ScalarType model_dtype) const;

 private:
  flow_euler_sampler_options options_;
  at::Tensor sigmas_, timesteps_;
  std::vector<double> guidance_scales_;
};

}  // namespace loom

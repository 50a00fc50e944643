#pragma once
// Flow matching as FastVideo's fine-tune method trains a video DiT (Wan, docs/training.md): each
// sample's noise level σ is drawn from FastVideo's timestep density (uniform, logit-normal or
// "mode"), looked up in the discrete schedule of its flow-match scheduler (num_train_timesteps levels,
// shifted by flow_shift), and the model is trained to predict the velocity ε − x0 at
// x_σ = (1 − σ) x0 + σ ε, with the mean squared error computed in fp32.
//
//   const loom::flow_matching method({.weighting_scheme = loom::timestep_density::logit_normal, .flow_shift = 3});
//   at::Generator draws = loom::step_generator(seed, step, rank, micro, latents.device());
//   const loom::flow_matching_inputs in = method.noise(latents, draws);   // noise, then the timesteps
//   at::Tensor loss = method.loss(job.forward(in.noisy, in.timesteps, text), in);
//
// The draws come from an explicit generator of (seed, step, rank, micro-batch), so a resumed run
// draws what a run never stopped would have drawn, with no generator state to save.

#include <loom/dsl/noise_expert.hpp>
#include <loom/dsl/options.hpp>
#include <loom/train/lr_schedule.hpp>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>

namespace loom {

// How u in [0, 1) is drawn before it picks a level of the schedule: FastVideo's weighting_scheme
// (SD3's compute_density_for_timestep_sampling).
enum class timestep_density {
  uniform,       // u ~ U[0, 1)
  logit_normal,  // u = sigmoid(n), n ~ N(logit_mean, logit_std²)
  mode,          // u = 1 − v − mode_scale · (cos²(π v / 2) − 1 + v), v ~ U[0, 1)
};

[[nodiscard]] std::string_view to_string(timestep_density density) noexcept;
// The density a run file names ("uniform", "logit_normal", "mode"), if it is one.
[[nodiscard]] std::optional<timestep_density> timestep_density_named(std::string_view name) noexcept;

// FastVideo's names and defaults (training.model and the model's flow_shift).
struct flow_matching_options {
  timestep_density weighting_scheme = timestep_density::uniform;
  double logit_mean = 0.0;
  double logit_std = 1.0;
  double mode_scale = 1.0;
  // σ' = flow_shift · σ / (1 + (flow_shift − 1) · σ): above 1, more of the draws land at high noise.
  double flow_shift = 3.0;
  std::int64_t num_train_timesteps = 1000;
  // FastVideo's x0-prediction form of the loss: the prediction v̂ read as x̂0 = x_σ − σ v̂ and
  // compared with x0, rather than v̂ with the velocity.
  bool precondition_outputs = false;
  // FastVideo's training_cfg_rate: the probability with which a sample's text states are replaced
  // by the unconditional ones (dropped_text), so the model also learns the unconditional velocity
  // that classifier-free guidance needs.
  double training_cfg_rate = 0.0;
  // Wan 2.2 A14B's boundary_ratio (FastVideo's and diffusers' name): two experts split the timesteps
  // at boundary_ratio · num_train_timesteps, the high-noise one (diffusers' `transformer`) at and
  // above it and the low-noise one (`transformer_2`) below; a step trains one of them
  // (expert_for_step) on noise levels of its range. 0: a single model.
  double boundary_ratio = 0.0;

  // What a run file's "flow_matching" object sets (FastVideo's training.model and flow_shift).
  static constexpr auto fields() {
    return std::tuple{option_field{"weighting_scheme", &flow_matching_options::weighting_scheme},
                      option_field{"logit_mean", &flow_matching_options::logit_mean},
                      option_field{"logit_std", &flow_matching_options::logit_std},
                      option_field{"mode_scale", &flow_matching_options::mode_scale},
                      option_field{"flow_shift", &flow_matching_options::flow_shift},
                      option_field{"num_train_timesteps", &flow_matching_options::num_train_timesteps},
                      option_field{"precondition_outputs", &flow_matching_options::precondition_outputs},
                      option_field{"training_cfg_rate", &flow_matching_options::training_cfg_rate},
                      option_field{"boundary_ratio", &flow_matching_options::boundary_ratio}};
  }

  // The first field out of range, if any ("flow_shift", "is 0; give a positive shift").
  [[nodiscard]] std::optional<option_problem> problem() const;
  // "weighting_scheme=uniform, logit_mean=0, ...": every field, as a run file names it.
  [[nodiscard]] std::string describe() const;
};

// The shift of a noise level: flow_shift · σ / (1 + (flow_shift − 1) · σ).
[[nodiscard]] double shifted_sigma(double sigma, double flow_shift) noexcept;

// One micro-batch's inputs and target; σ and the timesteps are fp32, one a sample.
struct flow_matching_inputs {
  at::Tensor noisy;      // (1 − σ) x0 + σ ε, in x0's dtype
  at::Tensor timesteps;  // [B]: σ · num_train_timesteps, the model's timestep
  at::Tensor sigmas;     // [B]
  at::Tensor velocity;   // ε − x0, fp32: what the model is trained to predict
  // With precondition_outputs: x0, fp32, which the prediction read as x̂0 = x_σ − σ v̂ is compared
  // with; undefined otherwise.
  at::Tensor clean{};
};

class flow_matching {
 public:
  // Throws std::invalid_argument naming the first option out of range. The schedule's tables are
  // kept on `device`: the generator's, where the levels are drawn, saves a copy of them each draw.
  // Picking a step's levels reads nothing on the host either way.
  explicit flow_matching(const flow_matching_options& options, c10::Device device = c10::kCPU);

  [[nodiscard]] const flow_matching_options& options() const noexcept { return options_; }
  // The schedule's levels, highest first: σ_k = shift((N − k) / N) for k = 0 … N − 1, and the
  // timesteps σ_k · N, fp32, computed as FastVideo's FlowMatchEulerDiscreteScheduler computes them.
  [[nodiscard]] const at::Tensor& sigmas() const noexcept { return sigmas_; }
  [[nodiscard]] const at::Tensor& timesteps() const noexcept { return timesteps_; }

  // `batch` draws of u from the density, fp32, on the generator's device.
  [[nodiscard]] at::Tensor draw_u(std::int64_t batch, at::Generator& generator) const;
  // The level each u picks: k = ⌊u · N⌋ (a u of 1, which a sigmoid can round to in fp32, picks the
  // last level rather than one past it).
  [[nodiscard]] at::Tensor levels(const at::Tensor& u) const;
  // For clean latents x0 [B, ...]: draws ε like x0, then B levels, from `generator`, in FastVideo's order.
  [[nodiscard]] flow_matching_inputs noise(const at::Tensor& x0, at::Generator& generator) const;
  // The same with every level in the expert's range: u drawn from the density as above and spread
  // over the expert's levels alone, k = K + ⌊u · (N − K)⌋ for the low-noise expert and ⌊u · K⌋ for
  // the high-noise one, where the first K levels have timesteps at or above the boundary. Needs a
  // boundary_ratio.
  [[nodiscard]] flow_matching_inputs noise(const at::Tensor& x0, at::Generator& generator, noise_expert expert) const;
  // The expert that step `step` trains, the same on every rank (it depends on the seed and the step
  // alone, not on a rank's data, so no rank waits for another's choice): the low-noise one with
  // probability boundary_ratio, as FastVideo draws it, the high-noise one otherwise. Needs a
  // boundary_ratio.
  [[nodiscard]] noise_expert expert_for_step(std::uint64_t seed, std::int64_t step) const;
  // The number of levels whose timesteps are at or above the boundary (the high-noise expert's).
  [[nodiscard]] std::int64_t high_noise_levels() const noexcept { return high_noise_levels_; }
  // The mean squared error between the prediction and the velocity, in fp32; with
  // precondition_outputs (inputs.clean defined) between x̂0 = x_σ − σ v̂ and x0, as FastVideo computes it.
  [[nodiscard]] static at::Tensor loss(const at::Tensor& prediction, const flow_matching_inputs& inputs);
  // training_cfg_rate's dropout: `text` [B, ...] with each sample's states replaced by
  // `unconditional` ([1, ...] or [B, ...]: the negative or empty prompt's) where a draw from
  // `generator` (B values of U[0, 1), after noise()'s) falls below the rate; `text` itself at a rate of 0,
  // which draws nothing.
  [[nodiscard]] at::Tensor dropped_text(const at::Tensor& text, const at::Tensor& unconditional,
                                        at::Generator& generator) const;

 private:
  [[nodiscard]] flow_matching_inputs noised(const at::Tensor& x0, at::Generator& generator,
                                            std::optional<noise_expert> expert) const;
  void require_boundary(std::string_view call) const;

  flow_matching_options options_;
  at::Tensor sigmas_, timesteps_;
  std::int64_t high_noise_levels_ = 0;
};

// A generator on `device` (the CPU's or a CUDA device's kind) seeded by (seed, step, rank, micro):
// the draws of one micro-batch on one rank, the same in a resumed run.
[[nodiscard]] at::Generator step_generator(std::uint64_t seed, std::int64_t step, int rank, int micro,
                                           c10::Device device = c10::kCPU);

}  // namespace loom

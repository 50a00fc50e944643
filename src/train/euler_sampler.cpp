#include <loom/train/euler_sampler.hpp>

#include <loom/base/text.hpp>
#include <loom/dsl/noise_expert.hpp>
#include <loom/runtime/host_reads.hpp>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <cmath>
#include <stdexcept>
#include <vector>

namespace loom {

std::optional<option_problem> flow_euler_sampler_options::problem() const {
  if (num_inference_steps < 1) {
    return option_problem{"num_inference_steps",
                          fmt::format("is {}; give the number of sampling steps, e.g. 50", num_inference_steps)};
  }
  if (!(shift > 0) || !std::isfinite(shift)) {
    return option_problem{"shift", fmt::format("is {}; give a positive shift (1: none)", shift)};
  }
  if (!std::isfinite(guidance_scale)) {
    return option_problem{"guidance_scale",
                          fmt::format("is {}; give a finite scale (at most 1: no guidance)", guidance_scale)};
  }
  if (num_train_timesteps < 1) {
    return option_problem{"num_train_timesteps",
                          fmt::format("is {}; give the schedule's number of levels, e.g. 1000", num_train_timesteps)};
  }
  if (!(boundary_ratio >= 0 && boundary_ratio < 1)) {
    return option_problem{
        "boundary_ratio",
        fmt::format("is {}; give the experts' boundary in (0, 1), the pipeline's (e.g. 0.875), or 0 for one model",
                    boundary_ratio)};
  }
  if (guidance_scale_2) {
    if (!std::isfinite(*guidance_scale_2)) {
      return option_problem{"guidance_scale_2", fmt::format("is {}; give a finite scale", *guidance_scale_2)};
    }
    // WanPipeline turns guidance on or off by guidance_scale alone, ignoring this one.
    if (guidance_scale <= 1 && *guidance_scale_2 > 1) {
      return option_problem{
          "guidance_scale_2",
          fmt::format("is {}, but guidance_scale {} (at most 1) turns guidance off for both experts, as WanPipeline "
                      "does: give a guidance_scale above 1 as well, or leave guidance_scale_2 out",
                      *guidance_scale_2, guidance_scale)};
    }
  }
  return std::nullopt;
}

std::string flow_euler_sampler_options::describe() const {
  return fmt::format(
      "num_inference_steps={}, shift={}, guidance_scale={}, num_train_timesteps={}, guidance_scale_2={}, "
      "boundary_ratio={}",
      num_inference_steps, shift, guidance_scale, num_train_timesteps,
      guidance_scale_2 ? fmt::format("{}", *guidance_scale_2) : std::string("none"), boundary_ratio);
}

flow_euler_sampler::flow_euler_sampler(const flow_euler_sampler_options& options) : options_(options) {
  if (const auto found = options_.problem()) {
    throw_error<std::invalid_argument>("flow_euler_sampler: {} {}", found->option, found->problem);
  }
  // Not an option's problem: a run file may leave the boundary to the pipeline its recipe reads.
  if (options_.guidance_scale_2 && options_.boundary_ratio == 0) {
    throw_error<std::invalid_argument>(
        "flow_euler_sampler: guidance_scale_2 is {}, the low-noise expert's scale, and boundary_ratio is 0 (one "
        "model): give the pipeline's boundary_ratio, or leave guidance_scale_2 out",
        *options_.guidance_scale_2);
  }
  const std::int64_t levels = options_.num_train_timesteps;
  const double shift = options_.shift;
  // The training schedule's first and last levels, fp32, as the scheduler's constructor shifts them.
  const at::Tensor ends = at::tensor({static_cast<float>(levels), 1.0F}) / static_cast<double>(levels);
  const at::Tensor shifted_ends = (ends * shift) / (ends * (shift - 1) + 1);
  const double highest = host_value<float>(shifted_ends[0]) * static_cast<double>(levels);
  const double lowest = host_value<float>(shifted_ends[1]) * static_cast<double>(levels);
  // set_timesteps: numpy's linspace between them in float64 (the last point exactly the end), each
  // shifted again in float64, then fp32.
  const std::int64_t steps = options_.num_inference_steps;
  const double step = steps > 1 ? (lowest - highest) / static_cast<double>(steps - 1) : 0.0;
  std::vector<double> sigmas(static_cast<std::size_t>(steps));
  for (std::int64_t i = 0; i < steps; ++i) {
    const double point = i + 1 == steps && steps > 1 ? lowest : static_cast<double>(i) * step + highest;
    const double sigma = point / static_cast<double>(levels);
    sigmas[static_cast<std::size_t>(i)] = shift * sigma / (1 + (shift - 1) * sigma);
  }
  const at::Tensor chosen = at::tensor(sigmas, at::TensorOptions().dtype(at::kDouble)).to(at::kFloat);
  timesteps_ = chosen * levels;
  sigmas_ = at::cat({chosen, at::zeros({1}, at::kFloat)});
  guidance_scales_.reserve(static_cast<std::size_t>(steps));
  for (std::int64_t i = 0; i < steps; ++i) {
    const bool low_noise =
        options_.boundary_ratio > 0 &&
        expert_at(host_value<float>(timesteps_[i]), options_.boundary_ratio, levels) == noise_expert::low_noise;
    guidance_scales_.push_back(low_noise ? options_.guidance_scale_2.value_or(options_.guidance_scale)
                                         : options_.guidance_scale);
  }
}

at::Tensor flow_euler_sampler::sample(const velocity_model& model, const at::Tensor& noise, const at::Tensor& text,
                                      const at::Tensor& negative_text, at::ScalarType model_dtype) const {
  if (noise.dim() < 1 || noise.size(0) < 1) {
    throw_error<std::invalid_argument>("flow_euler_sampler: the noise has no batch dimension; give [B, ...]");
  }
  if (guided() && !negative_text.defined()) {
    throw_error<std::invalid_argument>(
        "flow_euler_sampler: guidance_scale {} guides by the negative prompt, and none was given: give its text "
        "states, or a guidance_scale of at most 1",
        options_.guidance_scale);
  }
  const c10::NoGradGuard no_grad;
  const at::Tensor sigmas = to_device(sigmas_, noise.device(), at::kFloat);
  const at::Tensor timesteps = to_device(timesteps_, noise.device(), at::kFloat);
  const std::int64_t batch = noise.size(0);
  at::Tensor latents = noise.to(at::kFloat);
  for (std::int64_t i = 0; i < options_.num_inference_steps; ++i) {
    const at::Tensor input = latents.to(model_dtype);
    const at::Tensor timestep = timesteps[i].expand({batch});
    at::Tensor velocity = model(input, timestep, text);
    if (guided()) {
      const at::Tensor unconditional = model(input, timestep, negative_text);
      velocity = unconditional + (velocity - unconditional) * guidance_scales_[static_cast<std::size_t>(i)];
    }
    // The scheduler's step: the sample in fp32, the move by a 0-d σ difference (which takes the
    // velocity's dtype for the product), and the result in the velocity's dtype.
    latents = (latents.to(at::kFloat) + (sigmas[i + 1] - sigmas[i]) * velocity).to(velocity.scalar_type());
  }
  return latents;
}

}  // namespace loom

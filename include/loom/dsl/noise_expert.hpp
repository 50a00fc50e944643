#pragma once
// Which of two experts that split a diffusion model's timesteps at a boundary a pass runs (Wan 2.2
// A14B's): the word a model of two experts (loom::models::WanExperts) and flow matching's draws
// (loom::flow_matching::expert_for_step) share, so that a step's draw names the expert it runs.

#include <cstdint>
#include <string_view>

namespace loom {

enum class noise_expert : std::uint8_t {
  high_noise,  // timesteps at or above the boundary: diffusers' `transformer`
  low_noise,   // below it: `transformer_2`
};

[[nodiscard]] constexpr std::string_view to_string(noise_expert expert) noexcept {
  return expert == noise_expert::high_noise ? "high_noise" : "low_noise";
}

// Where WanPipeline's loop switches experts: boundary_ratio · num_train_timesteps, a Python float
// that PyTorch narrows to the fp32 of the timestep it is compared with.
[[nodiscard]] constexpr float boundary_timestep(double boundary_ratio, std::int64_t num_train_timesteps) noexcept {
  return static_cast<float>(boundary_ratio * static_cast<double>(num_train_timesteps));
}

// The expert WanPipeline takes at an fp32 `timestep`: the one rule the model's choice, flow
// matching's levels and the sampler's guidance follow.
[[nodiscard]] constexpr noise_expert expert_at(float timestep, double boundary_ratio,
                                               std::int64_t num_train_timesteps) noexcept {
  return timestep >= boundary_timestep(boundary_ratio, num_train_timesteps) ? noise_expert::high_noise
                                                                            : noise_expert::low_noise;
}

}  // namespace loom

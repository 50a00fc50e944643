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

}  // namespace loom

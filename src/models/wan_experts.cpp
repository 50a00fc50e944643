#include <loom/models/wan_experts.hpp>

#include "config_json.hpp"

#include <loom/base/text.hpp>
#include <loom/runtime/host_reads.hpp>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <optional>
#include <span>
#include <stdexcept>
#include <string>

namespace loom::models {
namespace {

using json = nlohmann::json;

constexpr std::string_view model_name = "loom::models::WanExperts";

// Why a ratio cannot split the timesteps between two experts; none when it can.
std::optional<std::string> ratio_problem(double ratio) {
  if (ratio > 0 && ratio < 1) return std::nullopt;
  return fmt::format(
      "boundary_ratio is {}, outside (0, 1): one expert would take every timestep; give a ratio between 0 and 1 "
      "(Wan 2.2 T2V-A14B's is 0.875)",
      ratio);
}

double read_boundary_ratio(const std::filesystem::path& pipeline_folder) {
  const std::filesystem::path file = pipeline_folder / "model_index.json";
  const auto [source, text] =
      detail::read_config_text(file, "WanExperts",
                               "give the folder of a Wan 2.2 A14B pipeline as diffusers saves it (model_index.json, "
                               "transformer/, transformer_2/)");
  const detail::config_json read(text, "WanExperts", source, "give a diffusers pipeline's model_index.json");
  const json* ratio = read.find("boundary_ratio");
  if (ratio == nullptr) {
    read.fail(
        "'boundary_ratio' is missing or null, so this is a pipeline of one transformer: read its transformer/ with "
        "loom::models::Wan");
  }
  if (!ratio->is_number()) read.fail("'boundary_ratio' is {}: give a number between 0 and 1", ratio->dump());
  const double value = ratio->get<double>();
  if (const auto problem = ratio_problem(value)) read.fail("{}", *problem);
  return value;
}

// scheduler/scheduler_config.json's num_train_timesteps; diffusers' default, 1000, without it.
std::int64_t read_num_train_timesteps(const std::filesystem::path& pipeline_folder) {
  constexpr std::int64_t diffusers_default = 1000;
  const std::filesystem::path file = pipeline_folder / "scheduler" / "scheduler_config.json";
  if (!std::filesystem::exists(file)) return diffusers_default;
  const auto [source, text] = detail::read_config_text(file, "WanExperts", "give the pipeline's scheduler config");
  const detail::config_json read(text, "WanExperts", source, "give a diffusers scheduler's scheduler_config.json");
  return read.whole("num_train_timesteps", diffusers_default);
}

const wan_experts_config& checked(const wan_experts_config& config) {
  if (const auto problem = ratio_problem(config.boundary_ratio))
    throw_error<std::invalid_argument>("{}: {}", model_name, *problem);
  if (config.num_train_timesteps < 1) {
    throw_error<std::invalid_argument>(
        "{}: num_train_timesteps is {}: give the scheduler's number of training timesteps, a positive whole number",
        model_name, config.num_train_timesteps);
  }
  return config;
}

// The expert as the messages name it: its side and its component.
std::string_view described(noise_expert expert) noexcept {
  return expert == noise_expert::high_noise ? "the high-noise expert (transformer)"
                                            : "the low-noise expert (transformer_2)";
}

}  // namespace

wan_experts_config wan_experts_config::from_pretrained(const std::filesystem::path& pipeline_folder) {
  wan_experts_config config;
  config.boundary_ratio = read_boundary_ratio(pipeline_folder);
  config.transformer = wan_config::from_pretrained(pipeline_folder / "transformer");
  config.transformer_2 = wan_config::from_pretrained(pipeline_folder / "transformer_2");
  config.num_train_timesteps = read_num_train_timesteps(pipeline_folder);
  return config;
}

WanExpertsImpl::WanExpertsImpl(const wan_experts_config& config_)
    : config(checked(config_)),
      transformer(register_module("transformer", std::make_shared<loom::nn::Branch<WanImpl>>(config.transformer))),
      transformer_2(
          register_module("transformer_2", std::make_shared<loom::nn::Branch<WanImpl>>(config.transformer_2))) {}

noise_expert WanExpertsImpl::expert_for(float timestep) const noexcept {
  return expert_at(timestep, config.boundary_ratio, config.num_train_timesteps);
}

at::Tensor WanExpertsImpl::forward(const at::Tensor& latents, const at::Tensor& timestep, const at::Tensor& text) {
  if (!timestep.defined() || timestep.numel() == 0) {
    throw_error<std::invalid_argument>(
        "{}: the timestep holds no value to choose an expert by: give one a sample, [batch], or one a token, "
        "[batch, patches]",
        model_name);
  }
  // A sample's timesteps are few (one a sample, or one a token): read once, compared on the host.
  const at::Tensor host = read_on_host_uncounted(timestep.detach().to(at::kFloat).contiguous());
  const std::span<const float> values(host.data_ptr<float>(), static_cast<std::size_t>(host.numel()));
  std::optional<float> high, low;
  for (const float t : values) {
    std::optional<float>& side = expert_for(t) == noise_expert::high_noise ? high : low;
    if (!side) side = t;
  }
  if (high && low) {
    throw_error<std::invalid_argument>(
        "{}: the timesteps fall on both sides of the boundary {} ({} for {}, {} for {}), and a pass runs one "
        "expert: give the expert explicitly, forward(latents, timestep, text, loom::noise_expert::...)",
        model_name, loom::boundary_timestep(config.boundary_ratio, config.num_train_timesteps), *high,
        described(noise_expert::high_noise), *low, described(noise_expert::low_noise));
  }
  return forward(latents, timestep, text, high ? noise_expert::high_noise : noise_expert::low_noise);
}

at::Tensor WanExpertsImpl::forward(const at::Tensor& latents, const at::Tensor& timestep, const at::Tensor& text,
                                   noise_expert expert) {
  return expert == noise_expert::high_noise ? transformer->forward(latents, timestep, text)
                                            : transformer_2->forward(latents, timestep, text);
}

}  // namespace loom::models

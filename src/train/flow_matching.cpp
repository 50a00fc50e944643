#include <loom/train/flow_matching.hpp>

#include <loom/base/text.hpp>
#include <loom/runtime/host_reads.hpp>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <cmath>
#include <mutex>
#include <numbers>
#include <stdexcept>
#include <vector>

namespace loom {
namespace {

constexpr std::array<std::pair<timestep_density, std::string_view>, 3> density_names{{
    {timestep_density::uniform, "uniform"},
    {timestep_density::logit_normal, "logit_normal"},
    {timestep_density::mode, "mode"},
}};

// splitmix64's finaliser: nearby inputs give unrelated seeds.
std::uint64_t mixed(std::uint64_t value) noexcept {
  value += 0x9e3779b97f4a7c15ULL;
  value = (value ^ (value >> 30U)) * 0xbf58476d1ce4e5b9ULL;
  value = (value ^ (value >> 27U)) * 0x94d049bb133111ebULL;
  return value ^ (value >> 31U);
}

// `values` [B], one a sample, shaped to broadcast over `batch` [B, ...].
at::Tensor one_a_sample(const at::Tensor& values, const at::Tensor& batch) {
  std::vector<std::int64_t> shape(static_cast<std::size_t>(batch.dim()), 1);
  shape.front() = batch.size(0);
  return values.view(shape);
}

}  // namespace

std::string_view to_string(timestep_density density) noexcept {
  for (const auto& [each, name] : density_names) {
    if (each == density) return name;
  }
  return "?";
}

std::optional<timestep_density> timestep_density_named(std::string_view name) noexcept {
  for (const auto& [each, spelled] : density_names) {
    if (spelled == name) return each;
  }
  return std::nullopt;
}

std::optional<option_problem> flow_matching_options::problem() const {
  const auto finite = [](double value) { return std::isfinite(value); };
  if (!finite(logit_mean)) return option_problem{"logit_mean", fmt::format("is {}; give a finite mean", logit_mean)};
  if (!(logit_std > 0) || !finite(logit_std)) {
    return option_problem{"logit_std", fmt::format("is {}; give a positive standard deviation", logit_std)};
  }
  if (!finite(mode_scale)) return option_problem{"mode_scale", fmt::format("is {}; give a finite scale", mode_scale)};
  if (!(flow_shift > 0) || !finite(flow_shift)) {
    return option_problem{"flow_shift", fmt::format("is {}; give a positive shift (1: none)", flow_shift)};
  }
  if (num_train_timesteps < 1) {
    return option_problem{"num_train_timesteps",
                          fmt::format("is {}; give the schedule's number of levels, e.g. 1000", num_train_timesteps)};
  }
  if (!(training_cfg_rate >= 0 && training_cfg_rate <= 1)) {
    return option_problem{
        "training_cfg_rate",
        fmt::format("is {}; give a probability in [0, 1] (0: never drop the text)", training_cfg_rate)};
  }
  if (!(boundary_ratio >= 0 && boundary_ratio < 1)) {
    return option_problem{
        "boundary_ratio",
        fmt::format("is {}; give the experts' boundary in (0, 1), e.g. 0.875 (0: one model)", boundary_ratio)};
  }
  return std::nullopt;
}

std::string flow_matching_options::describe() const {
  return fmt::format(
      "weighting_scheme={}, logit_mean={}, logit_std={}, mode_scale={}, flow_shift={}, "
      "num_train_timesteps={}, precondition_outputs={}, training_cfg_rate={}, boundary_ratio={}",
      to_string(weighting_scheme), logit_mean, logit_std, mode_scale, flow_shift, num_train_timesteps,
      precondition_outputs, training_cfg_rate, boundary_ratio);
}

double shifted_sigma(double sigma, double flow_shift) noexcept {
  return flow_shift * sigma / (1 + (flow_shift - 1) * sigma);
}

flow_matching::flow_matching(const flow_matching_options& options, c10::Device device) : options_(options) {
  if (const auto found = options_.problem()) {
    throw_error<std::invalid_argument>("flow_matching: {} {}", found->option, found->problem);
  }
  // In fp32 and in FastVideo's order of operations, so that each level is bit for bit its own.
  const auto levels = static_cast<double>(options_.num_train_timesteps);
  const at::Tensor unshifted =
      at::linspace(1, levels, options_.num_train_timesteps, at::TensorOptions().dtype(at::kFloat)).flip(0) / levels;
  const at::Tensor sigmas = (unshifted * options_.flow_shift) / (unshifted * (options_.flow_shift - 1) + 1);
  const at::Tensor timesteps = sigmas * levels;
  // The timesteps are fp32 and descending: the high-noise expert's come first (expert_at's rule).
  const float boundary = boundary_timestep(options_.boundary_ratio, options_.num_train_timesteps);
  high_noise_levels_ = options_.boundary_ratio > 0 ? host_value<std::int64_t>(timesteps.ge(boundary).sum()) : 0;
  sigmas_ = to_device(sigmas, device, at::kFloat);
  timesteps_ = to_device(timesteps, device, at::kFloat);
}

void flow_matching::require_boundary(std::string_view call) const {
  if (options_.boundary_ratio > 0) return;
  throw_error<std::invalid_argument>(
      "flow_matching::{}: the options give no boundary_ratio, so there are no experts to choose between; set "
      "boundary_ratio to the pipeline's (model_index.json's, e.g. 0.875) for a model of two experts",
      call);
}

noise_expert flow_matching::expert_for_step(std::uint64_t seed, std::int64_t step) const {
  require_boundary("expert_for_step");
  // A generator of (seed, step) and no rank: every rank draws the same. rank −1 keeps it apart from
  // every rank's own draws of the step.
  at::Generator shared = step_generator(seed, step, -1, 0);
  const at::Tensor u = at::rand({1}, shared, at::TensorOptions().dtype(at::kDouble));
  return *u.const_data_ptr<double>() < options_.boundary_ratio ? noise_expert::low_noise : noise_expert::high_noise;
}

at::Tensor flow_matching::draw_u(std::int64_t batch, at::Generator& generator) const {
  const auto options = at::TensorOptions().dtype(at::kFloat).device(generator.device());
  switch (options_.weighting_scheme) {
    case timestep_density::logit_normal:
      return at::sigmoid(at::normal(options_.logit_mean, options_.logit_std, {batch}, generator, options));
    case timestep_density::mode: {
      // FastVideo's expression, in its order of operations: the same u bit for bit.
      const at::Tensor v = at::rand({batch}, generator, options);
      return 1 - v - options_.mode_scale * (at::cos(v * std::numbers::pi / 2).pow(2) - 1 + v);
    }
    case timestep_density::uniform: break;
  }
  return at::rand({batch}, generator, options);
}

at::Tensor flow_matching::levels(const at::Tensor& u) const {
  return (u * static_cast<double>(options_.num_train_timesteps))
      .to(at::kLong)
      .clamp(0, options_.num_train_timesteps - 1);
}

flow_matching_inputs flow_matching::noise(const at::Tensor& x0, at::Generator& generator) const {
  return noised(x0, generator, std::nullopt);
}

flow_matching_inputs flow_matching::noise(const at::Tensor& x0, at::Generator& generator, noise_expert expert) const {
  require_boundary("noise");
  return noised(x0, generator, expert);
}

flow_matching_inputs flow_matching::noised(const at::Tensor& x0, at::Generator& generator,
                                           std::optional<noise_expert> expert) const {
  if (x0.dim() < 1 || x0.size(0) < 1) {
    throw_error<std::invalid_argument>("flow_matching: the latents have shape [{}]; give [B, ...] with B at least 1",
                                       fmt::join(x0.sizes(), ", "));
  }
  if (generator.device().is_cpu() && !sigmas_.is_cpu()) {
    throw_error<std::invalid_argument>(
        "flow_matching: the generator draws on the CPU and the schedule is on {}: give a generator on {} "
        "(loom::step_generator(..., device)), or make the flow_matching for the CPU",
        sigmas_.device().str(), sigmas_.device().str());
  }
  const at::Tensor epsilon = at::randn(x0.sizes(), generator, x0.options());
  const at::Tensor u = draw_u(x0.size(0), generator);
  at::Tensor chosen;
  if (!expert) {
    chosen = levels(u);
  } else {
    const std::int64_t first = *expert == noise_expert::high_noise ? 0 : high_noise_levels_;
    const std::int64_t end = *expert == noise_expert::high_noise ? high_noise_levels_ : options_.num_train_timesteps;
    if (end == first) {
      throw_error<std::invalid_argument>(
          "flow_matching: boundary_ratio {} leaves the {} expert no level of the {}; give a ratio that splits them",
          options_.boundary_ratio, to_string(*expert), options_.num_train_timesteps);
    }
    chosen = ((u.to(at::kDouble) * static_cast<double>(end - first)).to(at::kLong) + first).clamp(first, end - 1);
  }
  // The tables where the levels are: already so when the schedule was made for the generator's device,
  // else copied there from pinned memory (no wait either way).
  const auto on_levels_device = [&](const at::Tensor& table) { return to_device(table, chosen.device(), at::kFloat); };
  flow_matching_inputs inputs;
  inputs.sigmas = to_device(on_levels_device(sigmas_).index_select(0, chosen), x0.device(), at::kFloat);
  inputs.timesteps = to_device(on_levels_device(timesteps_).index_select(0, chosen), x0.device(), at::kFloat);
  const at::Tensor sigma = one_a_sample(inputs.sigmas.to(x0.scalar_type()), x0);
  inputs.noisy = (1.0 - sigma) * x0 + sigma * epsilon;
  inputs.velocity = (epsilon - x0).to(at::kFloat);
  if (options_.precondition_outputs) inputs.clean = x0.to(at::kFloat);
  return inputs;
}

at::Tensor flow_matching::loss(const at::Tensor& prediction, const flow_matching_inputs& inputs) {
  if (prediction.sizes() != inputs.velocity.sizes()) {
    throw_error<std::invalid_argument>(
        "flow_matching: the prediction has shape [{}], the velocity [{}]: the model must return one value a latent",
        fmt::join(prediction.sizes(), ", "), fmt::join(inputs.velocity.sizes(), ", "));
  }
  if (inputs.clean.defined()) {
    // FastVideo's order and dtypes: σ in the latents' (as it noised them), x̂0 as the operands
    // promote, then the error in fp32.
    const at::Tensor sigma = one_a_sample(inputs.sigmas.to(inputs.noisy.scalar_type()), prediction);
    const at::Tensor predicted_clean = inputs.noisy - prediction * sigma;
    return at::mse_loss(predicted_clean.to(at::kFloat), inputs.clean);
  }
  return at::mse_loss(prediction.to(at::kFloat), inputs.velocity);
}

at::Tensor flow_matching::dropped_text(const at::Tensor& text, const at::Tensor& unconditional,
                                       at::Generator& generator) const {
  const bool fits = text.dim() >= 1 && unconditional.dim() == text.dim() &&
                    (unconditional.size(0) == 1 || unconditional.size(0) == text.size(0)) &&
                    unconditional.sizes().slice(1) == text.sizes().slice(1);
  if (!fits) {
    throw_error<std::invalid_argument>(
        "flow_matching: the unconditional text states have shape [{}] and the batch's [{}]: give the negative or "
        "empty prompt's states as [1, ...] or [B, ...] with the batch's other sizes",
        fmt::join(unconditional.sizes(), ", "), fmt::join(text.sizes(), ", "));
  }
  if (options_.training_cfg_rate == 0) return text;
  const at::Tensor draws =
      at::rand({text.size(0)}, generator, at::TensorOptions().dtype(at::kFloat).device(generator.device()));
  const at::Tensor dropped =
      one_a_sample(to_device(draws < options_.training_cfg_rate, text.device(), at::kBool), text);
  return at::where(dropped, unconditional.to(text.scalar_type()), text);
}

at::Generator step_generator(std::uint64_t seed, std::int64_t step, int rank, int micro, c10::Device device) {
  std::uint64_t state = mixed(seed);
  for (const auto part :
       {static_cast<std::uint64_t>(step), static_cast<std::uint64_t>(rank), static_cast<std::uint64_t>(micro)}) {
    state = mixed(state ^ part);
  }
  if (device.is_cpu()) return at::make_generator<at::CPUGeneratorImpl>(state);
  // Another device's kind has its own generator type: a copy of its default one, seeded afresh.
  at::Generator base = at::globalContext().defaultGenerator(device);
  const std::lock_guard<std::mutex> lock(base.mutex());
  at::Generator generator = base.clone();
  generator.set_current_seed(state);
  return generator;
}

}  // namespace loom

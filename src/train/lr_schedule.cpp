#include <loom/train/lr_schedule.hpp>

#include <loom/base/text.hpp>

#include <fmt/format.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>
#include <tuple>

namespace loom {

std::string_view to_string(decay_shape shape) noexcept {
  switch (shape) {
    case decay_shape::linear: return "linear";
    case decay_shape::cosine: return "cosine";
  }
  return "?";
}

std::optional<option_problem> lr_schedule::problem() const {
  if (!(peak > 0) || !std::isfinite(peak)) {
    return option_problem{"peak", fmt::format("is {}; give a positive learning rate", peak)};
  }
  if (total_steps < 1) {
    return option_problem{"total_steps", fmt::format("is {}; give the number of optimizer steps", total_steps)};
  }
  if (warmup_steps < 0) return option_problem{"warmup_steps", fmt::format("is {}; give 0 or more", warmup_steps)};
  if (decay_steps < 0) return option_problem{"decay_steps", fmt::format("is {}; give 0 or more", decay_steps)};
  for (const auto& [name, ratio, steps, steps_name] :
       {std::tuple{"warmup_ratio", warmup_ratio, warmup_steps, "warmup_steps"},
        std::tuple{"decay_ratio", decay_ratio, decay_steps, "decay_steps"}}) {
    if (!ratio) continue;
    if (!(*ratio >= 0 && *ratio <= 1)) {
      return option_problem{name, fmt::format("is {}; give a fraction of the steps in [0, 1]", *ratio)};
    }
    if (steps != 0) {
      return option_problem{
          name, fmt::format("({}) and {} ({}) both give the length; give one of them", *ratio, steps_name, steps)};
    }
  }
  if (warmup_length() + decay_length() > total_steps) {
    if (!warmup_ratio && !decay_ratio) {
      return option_problem{"warmup_steps",
                            fmt::format("({}) and decay_steps ({}) add up to more than total_steps ({})", warmup_steps,
                                        decay_steps, total_steps)};
    }
    return option_problem{warmup_ratio ? "warmup_ratio" : "decay_ratio",
                          fmt::format("gives a warmup of {} steps and a decay of {}, more than total_steps ({}); give "
                                      "warmup_ratio and decay_ratio that add up to 1 or less",
                                      warmup_length(), decay_length(), total_steps)};
  }
  if (!(floor >= 0 && floor <= 1)) {
    return option_problem{"floor", fmt::format("is {}; give a fraction of the peak in [0, 1]", floor)};
  }
  return std::nullopt;
}

void lr_schedule::check() const {
  if (const auto found = problem()) {
    throw_error<std::invalid_argument>("lr_schedule: {} {}", found->option, found->problem);
  }
}

namespace {

// ratio · steps as a whole number of steps, by `round_to` (ceil or floor), where a product that is
// whole but for floating point counts as whole: 0.1 · 300 is 30.000000000000004, and 30 steps.
template <class Round>
std::int64_t steps_of(double ratio, std::int64_t steps, Round round_to) {
  const double exact = ratio * static_cast<double>(steps);
  const double nearest = std::round(exact);
  const bool whole = std::abs(exact - nearest) <= 1e-9 * std::max(1.0, exact);
  return static_cast<std::int64_t>(whole ? nearest : round_to(exact));
}

}  // namespace

std::int64_t lr_schedule::warmup_length() const {
  return warmup_ratio ? steps_of(*warmup_ratio, total_steps, [](double x) { return std::ceil(x); }) : warmup_steps;
}

std::int64_t lr_schedule::decay_length() const {
  return decay_ratio ? steps_of(*decay_ratio, total_steps, [](double x) { return std::floor(x); }) : decay_steps;
}

double lr_schedule::at(std::int64_t step) const {
  check();
  if (step < 1 || step > total_steps) {
    throw_error<std::invalid_argument>("lr_schedule: step {} is outside 1 … {}", step, total_steps);
  }
  const std::int64_t warmup = warmup_length();
  if (step <= warmup) return peak * static_cast<double>(step) / static_cast<double>(warmup + 1);
  const std::int64_t decaying = decay_length();
  const std::int64_t decay_from = total_steps - decaying;
  if (step <= decay_from) return peak;
  const double progress = static_cast<double>(step - decay_from) / static_cast<double>(decaying);
  const double remaining =
      decay == decay_shape::linear ? 1 - progress : 0.5 * (1 + std::cos(std::numbers::pi * progress));
  return peak * (floor + (1 - floor) * remaining);
}

void apply_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace loom

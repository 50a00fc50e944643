#include <loom/train/lr_schedule.hpp>

#include <loom/base/text.hpp>

#include <fmt/format.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>

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
  if (warmup_steps + decay_steps > total_steps) {
    return option_problem{"warmup_steps", fmt::format("({}) and decay_steps ({}) add up to more than total_steps ({})",
                                                      warmup_steps, decay_steps, total_steps)};
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

double lr_schedule::at(std::int64_t step) const {
  check();
  if (step < 1 || step > total_steps) {
    throw_error<std::invalid_argument>("lr_schedule: step {} is outside 1 … {}", step, total_steps);
  }
  if (step <= warmup_steps) return peak * static_cast<double>(step) / static_cast<double>(warmup_steps + 1);
  const std::int64_t decay_from = total_steps - decay_steps;
  if (step <= decay_from) return peak;
  const double progress = static_cast<double>(step - decay_from) / static_cast<double>(decay_steps);
  const double remaining =
      decay == decay_shape::linear ? 1 - progress : 0.5 * (1 + std::cos(std::numbers::pi * progress));
  return peak * (floor + (1 - floor) * remaining);
}

void apply_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace loom

#include <loom/train/ema.hpp>

#include <loom/base/text.hpp>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>

namespace loom {

std::optional<option_problem> ema_options::problem() const {
  if (!(decay >= 0 && decay < 1)) {
    return option_problem{"decay", fmt::format("is {}; give a decay in [0, 1), e.g. 0.999", decay)};
  }
  if (start_step < 0) {
    return option_problem{"start_step",
                          fmt::format("is {}; give the step the averaging starts at (0: the first)", start_step)};
  }
  return std::nullopt;
}

std::string ema_options::describe() const { return fmt::format("decay={}, start_step={}", decay, start_step); }

ema::ema(std::vector<at::Tensor> parameters, std::vector<std::string> names, const ema_options& options)
    : options_(options), parameters_(std::move(parameters)), names_(std::move(names)) {
  if (const auto found = options_.problem()) {
    throw_error<std::invalid_argument>("ema: {} {}", found->option, found->problem);
  }
  if (parameters_.size() != names_.size()) {
    throw_error<std::invalid_argument>("ema: {} parameters but {} names; give one name a parameter", parameters_.size(),
                                       names_.size());
  }
  const c10::NoGradGuard no_grad;
  averages_.reserve(parameters_.size());
  for (const at::Tensor& parameter : parameters_) {
    averages_.push_back(parameter.detach().to(at::kFloat, /*non_blocking=*/false, /*copy=*/true));
  }
}

void ema::update(std::int64_t step) {
  const c10::NoGradGuard no_grad;
  // FastVideo starts the average at its first step from start_step on (the first step when that is
  // 0): the weights then, blended with themselves. Until then the copy is what a checkpoint holds.
  if (step <= std::max<std::int64_t>(options_.start_step, 1)) {
    for (std::size_t i = 0; i < averages_.size(); ++i) averages_[i].copy_(parameters_[i]);
  }
  if (step < options_.start_step) return;
  // In FastVideo's order of operations, so that a sharded average is its whole one's slice, bit for bit.
  for (std::size_t i = 0; i < averages_.size(); ++i) {
    averages_[i].mul_(options_.decay).add_(parameters_[i].to(at::kFloat), 1 - options_.decay);
  }
}

tensor_state ema::state() const {
  tensor_state state;
  state.reserve(averages_.size());
  for (std::size_t i = 0; i < averages_.size(); ++i) state.push_back({names_[i], averages_[i]});
  return state;
}

void ema::load(const tensor_state& state) {
  std::map<std::string, const at::Tensor*> by_name;
  for (const named_tensor& t : state) by_name.emplace(t.name, &t.tensor);
  const c10::NoGradGuard no_grad;
  for (std::size_t i = 0; i < averages_.size(); ++i) {
    const auto found = by_name.find(names_[i]);
    if (found == by_name.end()) {
      throw_error<std::invalid_argument>("ema: the saved averages lack '{}', which trains here", names_[i]);
    }
    if (found->second->sizes() != averages_[i].sizes()) {
      throw_error<std::invalid_argument>("ema: the saved average of '{}' has shape [{}], this rank's [{}]", names_[i],
                                         fmt::join(found->second->sizes(), ", "),
                                         fmt::join(averages_[i].sizes(), ", "));
    }
    averages_[i].copy_(*found->second);
    by_name.erase(found);
  }
  if (!by_name.empty()) {
    throw_error<std::invalid_argument>("ema: the saved averages hold '{}', which does not train here",
                                       by_name.begin()->first);
  }
}

ema::weights_swap::weights_swap(const ema& averages) : averages_(averages) {
  const c10::NoGradGuard no_grad;
  kept_.reserve(averages_.parameters_.size());
  for (std::size_t i = 0; i < averages_.parameters_.size(); ++i) {
    const at::Tensor& parameter = averages_.parameters_[i];
    kept_.push_back(parameter.detach().clone());
    parameter.detach().copy_(averages_.averages_[i]);
  }
}

ema::weights_swap::~weights_swap() {
  const c10::NoGradGuard no_grad;
  for (std::size_t i = 0; i < kept_.size(); ++i) averages_.parameters_[i].detach().copy_(kept_[i]);
}

}  // namespace loom

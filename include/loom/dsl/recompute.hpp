// recompute(options): activation checkpointing. The chosen loom::nn::Unit blocks run their forward
// keeping no activations and run it again in backward, from the same generator states, so dropout
// draws the same masks; parameter names are unchanged (no wrapper module). docs/recompute.md.
#pragma once

#include <loom/dsl/describe.hpp>
#include <loom/dsl/diagnostics.hpp>
#include <loom/dsl/options.hpp>
#include <loom/dsl/pipe.hpp>
#include <loom/dsl/stage_kind.hpp>

#include <cstddef>
#include <string>
#include <string_view>
#include <tuple>

namespace loom {

struct recompute_options {
  // Every k-th unit in registration order, counting from one: units k, 2k, ... (torchtitan's layer
  // selective_ac_option = "k"); 1 recomputes every unit (its mode "full").
  std::size_t every = 1;

  static constexpr auto fields() { return std::tuple{option_field{"every", &recompute_options::every}}; }

  // Whether the unit at `index` (from zero, in registration order) recomputes.
  [[nodiscard]] constexpr bool recomputes(std::size_t index) const noexcept { return (index + 1) % every == 0; }
};

class recompute_stage : public detail::pipeable {
 public:
  using options_type = recompute_options;
  static constexpr stage_kind kind = stage_kind::recompute;
  static constexpr std::string_view name = "recompute";

  // For values known only at run time: the checks of recompute(...), throwing plan_error.
  static constexpr recompute_stage checked(const recompute_options& settings) {
    detail::enforce(settings.every == 0 ? violation::r18_every_zero : violation::none);
    return recompute_stage(settings);
  }

  [[nodiscard]] constexpr const recompute_options& settings() const noexcept { return settings_; }
  [[nodiscard]] std::string options() const { return options_text(settings_); }
  [[nodiscard]] std::string describe() const { return detail::call_text(name, options()); }

 private:
  constexpr explicit recompute_stage(const recompute_options& settings) : settings_(settings) {}

  recompute_options settings_;
};

// Constant arguments, checked while compiling: recompute() recomputes every unit, recompute({.every
// = 2}) every second one. With run-time values use recompute_stage::checked.
consteval recompute_stage recompute(recompute_options settings = {}) { return recompute_stage::checked(settings); }

}  // namespace loom

// trainable(patterns): keep more parameters trainable than lora leaves (norms, a head).
#pragma once

#include <loom/dsl/describe.hpp>
#include <loom/dsl/diagnostics.hpp>
#include <loom/dsl/pipe.hpp>
#include <loom/dsl/stage_kind.hpp>
#include <loom/dsl/targets.hpp>

#include <string>
#include <string_view>

namespace loom {

// R11: the first bad entry of a trainable(...), or none.
constexpr violation trainable_violation(const target_list& patterns) noexcept {
  if (patterns.empty()) return violation::r11_no_patterns;
  return detail::entries_violation(patterns, violation::r11_empty_pattern, violation::r11_duplicate_pattern);
}

class trainable_stage : public detail::pipeable {
 public:
  static constexpr stage_kind kind = stage_kind::trainable;
  static constexpr std::string_view name = "trainable";

  // For values known only at run time: the checks of trainable(...), throwing plan_error.
  static constexpr trainable_stage checked(target_list patterns) {
    detail::enforce(trainable_violation(patterns));
    return trainable_stage(patterns);
  }

  // Matched like lora targets, against module names.
  [[nodiscard]] constexpr const target_list& patterns() const noexcept { return patterns_; }

  [[nodiscard]] std::string options() const { return "patterns=" + detail::to_text(patterns_); }
  [[nodiscard]] std::string describe() const { return detail::call_text(name, options()); }

 private:
  constexpr explicit trainable_stage(const target_list& patterns) : patterns_(patterns) {}

  target_list patterns_;
};

// Constant arguments, checked while compiling: trainable({"norm", "lm_head"}).
// With run-time values use trainable_stage::checked(...).
consteval trainable_stage trainable(target_list patterns) { return trainable_stage::checked(patterns); }

}  // namespace loom

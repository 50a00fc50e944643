// lora(rank, targets, options): add LoRA adapters to the matching linear layers, freeze the rest.
#pragma once

#include <loom/dsl/describe.hpp>
#include <loom/dsl/diagnostics.hpp>
#include <loom/dsl/pipe.hpp>
#include <loom/dsl/stage_kind.hpp>
#include <loom/dsl/targets.hpp>

#include <optional>
#include <string>
#include <string_view>

namespace loom {

struct lora_options {
  std::optional<double> alpha{};  // unset: alpha = rank, so scaling() is 1
  double dropout = 0.0;           // on the adapter's input only
  target_list exclude{};          // matched like targets; wins over them
};

// R5: the first value of a lora(...) that is out of range, or none.
constexpr violation lora_violation(int rank, const target_list& targets, const lora_options& options) noexcept {
  if (rank <= 0) return violation::r5_rank_not_positive;
  if (options.alpha && !(*options.alpha > 0)) return violation::r5_alpha_not_positive;
  if (!(options.dropout >= 0 && options.dropout < 1)) return violation::r5_dropout_out_of_range;  // NaN too
  if (targets.empty()) return violation::r5_no_targets;
  if (const violation v =
          detail::entries_violation(targets, violation::r5_empty_target, violation::r5_duplicate_target);
      v != violation::none)
    return v;
  return detail::entries_violation(options.exclude, violation::r5_empty_exclude, violation::r5_duplicate_exclude);
}

class lora_stage : public detail::pipeable {
 public:
  static constexpr stage_kind kind = stage_kind::lora;
  static constexpr std::string_view name = "lora";

  // For values known only at run time: the checks of lora(...), throwing plan_error.
  static constexpr lora_stage checked(int rank, target_list targets = default_targets, lora_options options = {}) {
    detail::enforce(lora_violation(rank, targets, options));
    return lora_stage(rank, targets, options);
  }

  [[nodiscard]] constexpr int rank() const noexcept { return rank_; }
  [[nodiscard]] constexpr double alpha() const noexcept { return options_.alpha.value_or(rank_); }
  [[nodiscard]] constexpr double dropout() const noexcept { return options_.dropout; }
  [[nodiscard]] constexpr const target_list& targets() const noexcept { return targets_; }
  [[nodiscard]] constexpr const target_list& exclude() const noexcept { return options_.exclude; }
  // What the adapter's output is multiplied by.
  [[nodiscard]] constexpr double scaling() const noexcept { return alpha() / rank_; }

  [[nodiscard]] std::string options() const {
    return "rank=" + detail::to_text(rank_) + ", alpha=" + detail::to_text(alpha()) +
           ", dropout=" + detail::to_text(dropout()) + ", targets=" + detail::to_text(targets_) +
           ", exclude=" + detail::to_text(exclude());
  }
  [[nodiscard]] std::string describe() const { return detail::call_text(name, options()); }

 private:
  constexpr lora_stage(int rank, const target_list& targets, const lora_options& options)
      : rank_(rank), targets_(targets), options_(options) {}

  int rank_;
  target_list targets_;
  lora_options options_;
};

// Constant arguments, checked while compiling: lora(16, {"q_proj", "v_proj"}, {.alpha = 32}).
// With run-time values use lora_stage::checked(...).
consteval lora_stage lora(int rank, target_list targets = default_targets, lora_options options = {}) {
  return lora_stage::checked(rank, targets, options);
}

}  // namespace loom

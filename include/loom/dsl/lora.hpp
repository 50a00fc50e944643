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

// One key of PEFT's rank_pattern or alpha_pattern: a layer whose dotted name matches the regular
// expression (.*\.)?(key), i.e. `key` or a regex of the name's end at a dot, takes `value` as its rank
// (alpha); the first key that matches wins.
struct lora_pattern {
  std::string_view key;
  double value = 0;

  friend constexpr bool operator==(const lora_pattern&, const lora_pattern&) = default;
};

// {{"q_proj", 16}, {R"(layers\.0\..*)", 4}}: R12 past 16 keys.
using lora_pattern_list =
    detail::inline_list<lora_pattern, &lora_pattern::key, 16, violation::r12_too_many_pattern_keys>;

struct lora_options {
  std::optional<double> alpha{};      // unset: alpha = rank, so scaling() is 1
  double dropout = 0.0;               // on the adapter's input only
  target_list exclude{};              // matched like targets; wins over them
  bool use_rslora = false;            // scale by alpha / √rank (rsLoRA), not alpha / rank
  lora_pattern_list rank_pattern{};   // per-layer ranks, PEFT's rank_pattern
  lora_pattern_list alpha_pattern{};  // per-layer alphas, PEFT's alpha_pattern
  target_list modules_to_save{};      // whole modules trained and saved beside the adapters, PEFT's modules_to_save
};

namespace detail {

// The first empty or repeated key of a pattern list, or a value `valid` refuses, as the violations given.
constexpr violation pattern_violation(const lora_pattern_list& list, bool (*valid)(double),
                                      violation bad_value) noexcept {
  for (const lora_pattern* entry = list.begin(); entry != list.end(); ++entry) {
    if (entry->key.empty()) return violation::r5_empty_pattern_key;
    for (const lora_pattern* earlier = list.begin(); earlier != entry; ++earlier)
      if (earlier->key == entry->key) return violation::r5_duplicate_pattern_key;
    if (!valid(entry->value)) return bad_value;
  }
  return violation::none;
}

constexpr bool positive_whole(double value) noexcept {
  return value >= 1 && value <= 1e9 && value == static_cast<double>(static_cast<long long>(value));
}
constexpr bool positive(double value) noexcept { return value > 0; }  // NaN too

// √value of a positive whole number, while compiling too (std::sqrt is not constexpr in C++20):
// Newton's iteration from above, to the double nearest.
constexpr double square_root(int value) noexcept {
  double root = value;
  for (double next = 0.5 * (root + value / root); next < root; next = 0.5 * (root + value / root)) root = next;
  return root;
}

}  // namespace detail

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
  for (const target& t : targets) {
    if (t.kind == target_kind::all_linear && targets.size() > 1) return violation::r5_all_linear_not_alone;
  }
  for (const target_list* list : {&options.exclude, &options.modules_to_save}) {
    for (const target& t : *list) {
      if (t.kind == target_kind::all_linear) return violation::r5_all_linear_not_alone;
    }
  }
  if (const violation v =
          detail::entries_violation(options.exclude, violation::r5_empty_exclude, violation::r5_duplicate_exclude);
      v != violation::none)
    return v;
  if (const violation v = detail::entries_violation(options.modules_to_save, violation::r5_empty_module_to_save,
                                                    violation::r5_duplicate_module_to_save);
      v != violation::none)
    return v;
  if (const violation v =
          detail::pattern_violation(options.rank_pattern, detail::positive_whole, violation::r5_rank_pattern_value);
      v != violation::none)
    return v;
  return detail::pattern_violation(options.alpha_pattern, detail::positive, violation::r5_alpha_pattern_value);
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
  // What an adapter's output is multiplied by: alpha / rank, or alpha / √rank with use_rslora (a layer
  // that rank_pattern or alpha_pattern matches has its own: loom/lora/scaling.hpp).
  [[nodiscard]] constexpr double scaling() const noexcept {
    return alpha() / (use_rslora() ? detail::square_root(rank_) : rank_);
  }
  [[nodiscard]] constexpr bool use_rslora() const noexcept { return options_.use_rslora; }
  [[nodiscard]] constexpr const lora_pattern_list& rank_pattern() const noexcept { return options_.rank_pattern; }
  [[nodiscard]] constexpr const lora_pattern_list& alpha_pattern() const noexcept { return options_.alpha_pattern; }
  [[nodiscard]] constexpr const target_list& modules_to_save() const noexcept { return options_.modules_to_save; }

  [[nodiscard]] std::string options() const {
    // PEFT's options beyond plain LoRA only when set, so that a plain plan reads as it always has.
    return "rank=" + detail::to_text(rank_) + ", alpha=" + detail::to_text(alpha()) +
           ", dropout=" + detail::to_text(dropout()) + ", targets=" + detail::to_text(targets_) +
           ", exclude=" + detail::to_text(exclude()) + (use_rslora() ? ", use_rslora=true" : "") +
           patterns_text("rank_pattern", rank_pattern()) + patterns_text("alpha_pattern", alpha_pattern()) +
           (modules_to_save().empty() ? "" : ", modules_to_save=" + detail::to_text(modules_to_save()));
  }
  [[nodiscard]] std::string describe() const { return detail::call_text(name, options()); }

 private:
  static std::string patterns_text(std::string_view name, const lora_pattern_list& list) {
    if (list.empty()) return {};
    std::string text = ", " + std::string(name) + "={";
    for (const lora_pattern& entry : list) {
      if (text.back() != '{') text += ", ";
      text.append(entry.key).append(": ").append(detail::to_text(entry.value));
    }
    return text + "}";
  }

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

// The rules on stage order, as constexpr functions over a list of stage kinds. operator| runs them on
// every composition (and static_asserts the result); check_stages runs them on a plan assembled at
// run time. The value rules (R5, R11, R12) live with their stages.
#pragma once

#include <loom/dsl/diagnostics.hpp>
#include <loom/dsl/rule_table.hpp>
#include <loom/dsl/stage_kind.hpp>
#include <loom/dsl/violation.hpp>

#include <cstddef>
#include <span>

namespace loom {
namespace detail {

// R3's code for `stage` (lora or trainable) after `strategy`: the strategy's own sentence when the
// rule table gives it one (LOOM_R3_STRATEGIES), the general one otherwise.
constexpr violation too_late(stage_kind stage, stage_kind strategy) noexcept {
  const bool lora = stage == stage_kind::lora;
#define LOOM_DETAIL_R3_CODE(name, why, ...) \
  if (strategy == stage_kind::name)         \
    return lora ? violation::r3_lora_after_##name : violation::r3_trainable_after_##name;
  LOOM_R3_STRATEGIES(LOOM_DETAIL_R3_CODE)
#undef LOOM_DETAIL_R3_CODE
  return lora ? violation::r3_lora_after_strategy : violation::r3_trainable_after_strategy;
}

enum class pipeline_shape : unsigned char {
  plan,      // stages[0] is the model; stages may still be piped after it
  built,     // a plan as build() takes it: nothing follows
  fragment,  // stages that will follow a model: closure | closure, before it meets model<M>()
};

// One left-to-right pass; the first broken rule wins, so a message never depends on later stages.
constexpr violation scan(std::span<const stage_kind> stages, pipeline_shape shape) noexcept {
  std::size_t first = 0;  // index of the first stage after the model
  if (shape != pipeline_shape::fragment) {
    if (stages.empty() || stages[0] != stage_kind::model) {
      for (stage_kind k : stages)
        if (k == stage_kind::model) return violation::r1_model_not_first;
      return violation::r1_no_model;
    }
    first = 1;
  }
  bool has_strategy = false, has_seeded = false, has_lora = false, has_trainable = false;
  bool has_default_dtype = false, has_mixed_precision = false, has_recompute = false, has_pretrained = false;
  bool has_sequence_parallel = false, has_tensor_parallel = false, has_quantized = false;
  stage_kind strategy = stage_kind::local;
  for (std::size_t i = first; i != stages.size(); ++i) {
    const stage_kind k = stages[i];
    if (k == stage_kind::model)
      return shape != pipeline_shape::fragment ? violation::r1_two_models : violation::r1_model_not_first;
    if (has_strategy) {
      if (is_strategy(k)) return violation::r2_two_strategies;
      if (k == stage_kind::lora || k == stage_kind::trainable) return too_late(k, strategy);
      if (k == stage_kind::mixed_precision) return violation::r15_mixed_precision_after_strategy;
      if (k == stage_kind::recompute) return violation::r18_recompute_after_strategy;
      if (k == stage_kind::sequence_parallel) return violation::r20_sequence_parallel_after_strategy;
      if (k == stage_kind::tensor_parallel) return violation::r22_tensor_parallel_after_strategy;
      if (k == stage_kind::pretrained) return violation::r19_pretrained_after_strategy;
      if (k == stage_kind::quantized) return violation::r21_quantized_after_strategy;
      if (k == stage_kind::default_dtype) return violation::r17_default_dtype_not_after_model;
      return violation::r2_seeded_after_strategy;
    }
    switch (k) {
      case stage_kind::seeded:
        if (has_seeded) return violation::r4_seeded_twice;
        if (i != first) return violation::r4_seeded_not_after_model;
        has_seeded = true;
        break;
      case stage_kind::default_dtype:
        if (has_default_dtype) return violation::r17_default_dtype_twice;
        if (i != first && !(i == first + 1 && stages[first] == stage_kind::seeded))
          return violation::r17_default_dtype_not_after_model;
        has_default_dtype = true;
        break;
      case stage_kind::mixed_precision:
        if (has_mixed_precision) return violation::r15_two_mixed_precisions;
        has_mixed_precision = true;
        break;
      case stage_kind::pretrained:
        if (has_pretrained) return violation::r19_two_pretrained;
        if (has_lora || has_trainable) return violation::r19_pretrained_after_lora;
        if (has_quantized) return violation::r21_quantized_before_pretrained;
        has_pretrained = true;
        break;
      case stage_kind::quantized:
        if (has_quantized) return violation::r21_two_quantized;
        if (has_lora || has_trainable) return violation::r21_quantized_after_lora;
        if (has_tensor_parallel) return violation::r22_with_quantized;
        has_quantized = true;
        break;
      case stage_kind::recompute:
        if (has_recompute) return violation::r18_two_recomputes;
        has_recompute = true;
        break;
      case stage_kind::sequence_parallel:
        if (has_sequence_parallel) return violation::r20_two_sequence_parallels;
        has_sequence_parallel = true;
        break;
      case stage_kind::tensor_parallel:
        if (has_tensor_parallel) return violation::r22_two_tensor_parallels;
        if (has_quantized) return violation::r22_with_quantized;
        has_tensor_parallel = true;
        break;
      case stage_kind::lora:
        if (has_lora) return violation::r6_two_loras;
        if (has_trainable) return violation::r9_trainable_without_lora;
        has_lora = true;
        break;
      case stage_kind::trainable:
        if (has_trainable) return violation::r10_trainable_twice;
        // A fragment may still be piped after a plan that has lora; a plan cannot get one later.
        if (!has_lora && shape != pipeline_shape::fragment) return violation::r9_trainable_without_lora;
        has_trainable = true;
        break;
      default:
        // The strategy ends the plan: what the stages before it lack, they lack for good.
        if (has_quantized && !has_lora) return violation::r21_quantized_without_lora;
        has_strategy = true;
        strategy = k;
        break;
    }
  }
  if (shape == pipeline_shape::built && has_quantized && !has_lora) return violation::r21_quantized_without_lora;
  return violation::none;
}

}  // namespace detail

// The first rule that a whole plan (model first) breaks, or violation::none.
constexpr violation first_violation(std::span<const stage_kind> plan) noexcept {
  return detail::scan(plan, detail::pipeline_shape::plan);
}

// The first rule that a partial pipeline (the stages after the model) breaks, or violation::none.
constexpr violation first_violation_in_fragment(std::span<const stage_kind> fragment) noexcept {
  return detail::scan(fragment, detail::pipeline_shape::fragment);
}

// The first rule that a plan as build() takes it breaks: a whole plan that nothing follows, its
// strategy local() when it names none.
constexpr violation first_violation_when_built(std::span<const stage_kind> plan) noexcept {
  return detail::scan(plan, detail::pipeline_shape::built);
}

// Throws plan_error with the rule's sentence when the plan, as build() takes it, breaks a rule.
constexpr void check_stages(std::span<const stage_kind> plan) { detail::enforce(first_violation_when_built(plan)); }

}  // namespace loom

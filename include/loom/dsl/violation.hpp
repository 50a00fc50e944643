// What a rule function reports: the first broken rule of a plan, or none.
#pragma once

#include <loom/dsl/sentences.hpp>

#include <string_view>

namespace loom {

// One enumerator per sentence that a constexpr rule function can return. (R7, R8 and R13 are about
// types, not values: they exist only as static_asserts.)
enum class violation : unsigned char {
  none,
  r1_no_model,
  r1_model_not_first,
  r1_two_models,
  r2_two_strategies,
  r2_seeded_after_strategy,
  r3_lora_after_ddp,
  r3_lora_after_fsdp,
  r3_lora_after_strategy,
  r3_trainable_after_ddp,
  r3_trainable_after_fsdp,
  r3_trainable_after_strategy,
  r4_seeded_twice,
  r4_seeded_not_after_model,
  r5_rank_not_positive,
  r5_alpha_not_positive,
  r5_dropout_out_of_range,
  r5_no_targets,
  r5_empty_target,
  r5_duplicate_target,
  r5_empty_exclude,
  r5_duplicate_exclude,
  r6_two_loras,
  r9_trainable_without_lora,
  r10_trainable_twice,
  r11_no_patterns,
  r11_empty_pattern,
  r11_duplicate_pattern,
  r12_too_many_targets,
};

// The sentence printed for v: "loom R<n>: what is wrong: the fix (why)"; empty for none.
constexpr std::string_view sentence(violation v) noexcept {
  switch (v) {
    case violation::none: return {};
    case violation::r1_no_model: return LOOM_R1_NO_MODEL;
    case violation::r1_model_not_first: return LOOM_R1_MODEL_NOT_FIRST;
    case violation::r1_two_models: return LOOM_R1_TWO_MODELS;
    case violation::r2_two_strategies: return LOOM_R2_TWO_STRATEGIES;
    case violation::r2_seeded_after_strategy: return LOOM_R2_SEEDED_AFTER_STRATEGY;
    case violation::r3_lora_after_ddp: return LOOM_R3_LORA_AFTER_DDP;
    case violation::r3_lora_after_fsdp: return LOOM_R3_LORA_AFTER_FSDP;
    case violation::r3_lora_after_strategy: return LOOM_R3_LORA_AFTER_STRATEGY;
    case violation::r3_trainable_after_ddp: return LOOM_R3_TRAINABLE_AFTER_DDP;
    case violation::r3_trainable_after_fsdp: return LOOM_R3_TRAINABLE_AFTER_FSDP;
    case violation::r3_trainable_after_strategy: return LOOM_R3_TRAINABLE_AFTER_STRATEGY;
    case violation::r4_seeded_twice: return LOOM_R4_SEEDED_TWICE;
    case violation::r4_seeded_not_after_model: return LOOM_R4_SEEDED_NOT_AFTER_MODEL;
    case violation::r5_rank_not_positive: return LOOM_R5_RANK_NOT_POSITIVE;
    case violation::r5_alpha_not_positive: return LOOM_R5_ALPHA_NOT_POSITIVE;
    case violation::r5_dropout_out_of_range: return LOOM_R5_DROPOUT_OUT_OF_RANGE;
    case violation::r5_no_targets: return LOOM_R5_NO_TARGETS;
    case violation::r5_empty_target: return LOOM_R5_EMPTY_TARGET;
    case violation::r5_duplicate_target: return LOOM_R5_DUPLICATE_TARGET;
    case violation::r5_empty_exclude: return LOOM_R5_EMPTY_EXCLUDE;
    case violation::r5_duplicate_exclude: return LOOM_R5_DUPLICATE_EXCLUDE;
    case violation::r6_two_loras: return LOOM_R6_TWO_LORAS;
    case violation::r9_trainable_without_lora: return LOOM_R9_TRAINABLE_WITHOUT_LORA;
    case violation::r10_trainable_twice: return LOOM_R10_TRAINABLE_TWICE;
    case violation::r11_no_patterns: return LOOM_R11_NO_PATTERNS;
    case violation::r11_empty_pattern: return LOOM_R11_EMPTY_PATTERN;
    case violation::r11_duplicate_pattern: return LOOM_R11_DUPLICATE_PATTERN;
    case violation::r12_too_many_targets: return LOOM_R12_TOO_MANY_TARGETS;
  }
  return {};
}

// The rule id n of "loom R<n>: ..."; 0 for none. Read from the sentence so the two cannot disagree.
constexpr int rule_of(violation v) noexcept {
  constexpr std::string_view prefix = "loom R";
  const std::string_view text = sentence(v);
  if (!text.starts_with(prefix)) return 0;
  int id = 0;
  for (char c : text.substr(prefix.size())) {
    if (c < '0' || c > '9') break;
    id = id * 10 + (c - '0');
  }
  return id;
}

}  // namespace loom

// The kind of each stage: what the rules look at.
#pragma once

#include <string_view>

namespace loom {

// The strategies come last, from local on, so that is_strategy is one comparison: a new strategy is
// an enumerator at the end and its name_of case.
enum class stage_kind : unsigned char {
  model,
  seeded,
  default_dtype,
  pretrained,
  quantized,
  mixed_precision,
  recompute,
  sequence_parallel,
  tensor_parallel,
  lora,
  trainable,
  local,
  ddp,
  fsdp,
  custom_strategy,  // loom::strategy(S{...})
};

constexpr bool is_strategy(stage_kind k) noexcept { return k >= stage_kind::local; }

// The stage function's name, as a plan read from a file would spell it.
constexpr std::string_view name_of(stage_kind k) noexcept {
  switch (k) {
    case stage_kind::model: return "model";
    case stage_kind::seeded: return "seeded";
    case stage_kind::default_dtype: return "default_dtype";
    case stage_kind::pretrained: return "pretrained";
    case stage_kind::quantized: return "quantized";
    case stage_kind::mixed_precision: return "mixed_precision";
    case stage_kind::recompute: return "recompute";
    case stage_kind::sequence_parallel: return "sequence_parallel";
    case stage_kind::tensor_parallel: return "tensor_parallel";
    case stage_kind::lora: return "lora";
    case stage_kind::trainable: return "trainable";
    case stage_kind::local: return "local";
    case stage_kind::ddp: return "ddp";
    case stage_kind::fsdp: return "fsdp";
    case stage_kind::custom_strategy: return "strategy";
  }
  return {};
}

// Where a stage named `name` (as a run file spells it; "strategy" for any strategy) goes in a plan
// that the rules accept: stage_kind's order, which is one such plan's. An unknown name goes last.
constexpr int plan_position(std::string_view name) noexcept {
  if (name == "strategy") return static_cast<int>(stage_kind::local);
  for (int k = 0; k <= static_cast<int>(stage_kind::custom_strategy); ++k) {
    if (name_of(static_cast<stage_kind>(k)) == name) return k;
  }
  return static_cast<int>(stage_kind::custom_strategy) + 1;
}

}  // namespace loom

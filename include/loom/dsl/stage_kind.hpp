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
  mixed_precision,
  recompute,
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
    case stage_kind::mixed_precision: return "mixed_precision";
    case stage_kind::recompute: return "recompute";
    case stage_kind::lora: return "lora";
    case stage_kind::trainable: return "trainable";
    case stage_kind::local: return "local";
    case stage_kind::ddp: return "ddp";
    case stage_kind::fsdp: return "fsdp";
    case stage_kind::custom_strategy: return "strategy";
  }
  return {};
}

}  // namespace loom

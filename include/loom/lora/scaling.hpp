#pragma once
// The rank and scale of each adapted layer, by PEFT's rules (LoraModel._create_and_replace): a layer
// takes the value of the first key of rank_pattern (alpha_pattern) that its dotted name matches as
// the regular expression (.*\.)?(key), else r (lora_alpha); its update is scaled by alpha / rank, or
// by alpha / √rank with use_rslora (rsLoRA). One set of rules, whether it comes from the plan's
// lora(...) or from an adapter's adapter_config.json, so that the two are compared layer by layer.

#include <loom/dsl/lora.hpp>
#include <loom/io/peft.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom {

struct lora_scaling_rules {
  std::int64_t r = 8;
  double lora_alpha = 8;
  bool use_rslora = false;
  std::vector<std::pair<std::string, double>> rank_pattern;  // key, rank: in order, the first match wins
  std::vector<std::pair<std::string, double>> alpha_pattern;

  struct layer {
    std::int64_t rank;
    double alpha;
    double scaling;
  };

  [[nodiscard]] static lora_scaling_rules of(const lora_stage& stage);
  [[nodiscard]] static lora_scaling_rules of(const peft_lora_adapter& adapter);

  // The rank, alpha and scale of the layer named `name`. Throws std::invalid_argument naming a key
  // that is not a regular expression.
  [[nodiscard]] layer for_layer(std::string_view name) const;
  [[nodiscard]] bool per_layer() const noexcept { return !rank_pattern.empty() || !alpha_pattern.empty(); }
};

}  // namespace loom

#include <loom/lora/scaling.hpp>

#include <loom/base/text.hpp>

#include <cmath>
#include <regex>
#include <stdexcept>

namespace loom {
namespace {

// The value of the first key whose regex matches the end of `name` at a dot, as PEFT's
// get_pattern_key matches (.*\.)?(key)$; none when no key does.
const double* matched(const std::vector<std::pair<std::string, double>>& pattern, std::string_view name,
                      std::string_view which) {
  for (const auto& [key, value] : pattern) {
    std::regex expression;
    try {
      expression = std::regex("(.*\\.)?(" + key + ")");
    } catch (const std::regex_error& error) {
      throw_error<std::invalid_argument>(
          "lora {} key '{}' is not a regular expression ({}): give a module's name, or "
          "a regex of the end of its dotted name",
          which, key, error.what());
    }
    if (std::regex_match(name.begin(), name.end(), expression)) return &value;
  }
  return nullptr;
}

}  // namespace

lora_scaling_rules lora_scaling_rules::of(const lora_stage& stage) {
  lora_scaling_rules rules{.r = stage.rank(),
                           .lora_alpha = stage.alpha(),
                           .use_rslora = stage.use_rslora(),
                           .rank_pattern = {},
                           .alpha_pattern = {}};
  for (const lora_pattern& entry : stage.rank_pattern()) rules.rank_pattern.emplace_back(entry.key, entry.value);
  for (const lora_pattern& entry : stage.alpha_pattern()) rules.alpha_pattern.emplace_back(entry.key, entry.value);
  return rules;
}

lora_scaling_rules lora_scaling_rules::of(const peft_lora_adapter& adapter) {
  lora_scaling_rules rules{.r = adapter.r,
                           .lora_alpha = adapter.lora_alpha,
                           .use_rslora = adapter.use_rslora,
                           .rank_pattern = {},
                           .alpha_pattern = adapter.alpha_pattern};
  for (const auto& [key, rank] : adapter.rank_pattern) rules.rank_pattern.emplace_back(key, static_cast<double>(rank));
  return rules;
}

lora_scaling_rules::layer lora_scaling_rules::for_layer(std::string_view name) const {
  const double* rank = matched(rank_pattern, name, "rank_pattern");
  const double* alpha = matched(alpha_pattern, name, "alpha_pattern");
  layer result{.rank = rank ? static_cast<std::int64_t>(*rank) : r, .alpha = alpha ? *alpha : lora_alpha, .scaling = 0};
  const auto size = static_cast<double>(result.rank);
  result.scaling = result.alpha / (use_rslora ? std::sqrt(size) : size);
  return result;
}

}  // namespace loom

#include <loom/lora/peft_adapter.hpp>

#include <loom/base/text.hpp>
#include <loom/lora/adapter.hpp>
#include <loom/lora/scaling.hpp>

#include <torch/types.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>
#include <vector>

namespace loom {

peft_lora_adapter to_peft_adapter(const lora_layers& lora, const torch::nn::Module& module) {
  std::vector<std::string> not_adapters;
  peft_lora_adapter adapter;
  adapter.r = lora.rank();
  adapter.lora_alpha = lora.alpha();
  adapter.lora_dropout = lora.dropout();
  adapter.use_rslora = lora.rules().use_rslora;
  for (const auto& [key, rank] : lora.rules().rank_pattern) {
    adapter.rank_pattern.emplace_back(key, static_cast<std::int64_t>(rank));
  }
  adapter.alpha_pattern = lora.rules().alpha_pattern;
  adapter.target_modules = lora.adapted();
  for (const auto& item : module.named_parameters()) {
    if (lora_adapter::is_adapter_parameter(item.key())) {
      adapter.tensors.push_back({item.key(), item.value()});
    } else if (item.value().requires_grad()) {
      not_adapters.push_back(item.key());
    }
  }
  if (!not_adapters.empty()) {
    throw_error<std::logic_error>(
        "job.save_adapter(): trainable(...) also trains {} ({}), which a PEFT LoRA adapter cannot carry: a "
        "model loading it would keep its own values for them. Save the whole model with job.save_weights() as well",
        counted(static_cast<std::int64_t>(not_adapters.size()), "parameter"), fmt::join(not_adapters, ", "));
  }
  std::sort(adapter.target_modules.begin(), adapter.target_modules.end());
  return adapter;
}

void copy_peft_adapter_into(const lora_layers& lora, torch::nn::Module& module, const peft_lora_adapter& adapter,
                            const std::filesystem::path& path) {
  const auto refuse = [&](const std::string& reason) {
    throw_error<std::invalid_argument>("job.load_adapter('{}'): {}", path.string(), reason);
  };
  if (adapter.r != lora.rank()) {
    refuse(fmt::format("the adapter has rank r = {}, the plan lora({}, ...)", adapter.r, lora.rank()));
  }
  if (adapter.lora_alpha != lora.alpha()) {
    refuse(
        fmt::format("the adapter has lora_alpha = {}, the plan alpha = {}: its update would be scaled otherwise; "
                    "give lora(...) {{.alpha = {}}}",
                    adapter.lora_alpha, lora.alpha(), adapter.lora_alpha));
  }
  if (adapter.use_rslora != lora.rules().use_rslora) {
    refuse(
        fmt::format("the adapter {} use_rslora and the plan {}: its update would be scaled by alpha / {} rather "
                    "than alpha / {}; give lora(...) {{.use_rslora = {}}}",
                    adapter.use_rslora ? "sets" : "does not set", lora.rules().use_rslora ? "does" : "does not",
                    adapter.use_rslora ? "√r" : "r", adapter.use_rslora ? "r" : "√r", adapter.use_rslora));
  }
  // Per layer, where either side has rank_pattern or alpha_pattern: each adapted layer's rank and
  // scale by the adapter's rules equal to the plan's.
  const lora_scaling_rules theirs = lora_scaling_rules::of(adapter);
  if (theirs.per_layer() || lora.rules().per_layer()) {
    for (const std::string& layer : lora.adapted()) {
      const lora_scaling_rules::layer a = theirs.for_layer(layer), b = lora.rules().for_layer(layer);
      if (a.rank != b.rank || a.alpha != b.alpha) {
        refuse(
            fmt::format("'{}' has rank {} and alpha {} by the adapter's rank_pattern and alpha_pattern, rank {} "
                        "and alpha {} by the plan's: give lora(...) the adapter's patterns",
                        layer, a.rank, a.alpha, b.rank, b.alpha));
      }
    }
  }
  std::map<std::string, at::Tensor> mine;
  for (const auto& item : module.named_parameters()) {
    if (lora_adapter::is_adapter_parameter(item.key())) mine.emplace(item.key(), item.value());
  }
  std::set<std::string> missing;
  for (const auto& [name, tensor] : mine) missing.insert(name);
  std::vector<std::string> unexpected;
  for (const named_tensor& t : adapter.tensors) {
    const auto found = mine.find(t.name);
    if (found == mine.end()) {
      unexpected.push_back(t.name);
      continue;
    }
    missing.erase(t.name);
    if (found->second.sizes() != t.tensor.sizes()) {
      refuse(fmt::format("'{}' is [{}] in the adapter but [{}] in the model", t.name, fmt::join(t.tensor.sizes(), ", "),
                         fmt::join(found->second.sizes(), ", ")));
    }
  }
  if (!missing.empty() || !unexpected.empty()) {
    refuse(fmt::format("its layers differ from those the plan adapts: missing [{}], unexpected [{}]",
                       fmt::join(missing, ", "), fmt::join(unexpected, ", ")));
  }
  torch::NoGradGuard no_grad;
  for (const named_tensor& t : adapter.tensors) mine.at(t.name).copy_(t.tensor);
}

}  // namespace loom

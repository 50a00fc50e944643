#include <loom/lora/peft_adapter.hpp>

#include <loom/base/text.hpp>
#include <loom/dsl/describe.hpp>
#include <loom/lora/adapter.hpp>
#include <loom/lora/scaling.hpp>

#include <ATen/ATen.h>
#include <torch/types.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>
#include <vector>

namespace loom {

namespace {

// The tensor of `name` among `tensors`, or none.
const named_tensor* find_named(const std::vector<named_tensor>& tensors, std::string_view name) {
  const auto found =
      std::find_if(tensors.begin(), tensors.end(), [&](const named_tensor& t) { return t.name == name; });
  return found == tensors.end() ? nullptr : &*found;
}

// The parameters of the modules that the plan's modules_to_save select, by name.
std::map<std::string, at::Tensor> saved_module_parameters(const lora_layers& lora, const torch::nn::Module& module) {
  std::map<std::string, at::Tensor> saved;
  for (const auto& item : module.named_parameters()) {
    if (!lora_adapter::is_adapter_parameter(item.key()) && lora.saves(item.key()))
      saved.emplace(item.key(), item.value());
  }
  return saved;
}

}  // namespace

peft_lora_adapter to_peft_adapter(const lora_layers& lora, const torch::nn::Module& module,
                                  std::span<const tied_parameter> tied) {
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
  for (const target& name : lora.modules_to_save()) adapter.modules_to_save.emplace_back(name.text);
  const std::map<std::string, at::Tensor> saved = saved_module_parameters(lora, module);
  for (const auto& item : module.named_parameters()) {
    if (lora_adapter::is_adapter_parameter(item.key())) {
      adapter.tensors.push_back({item.key(), item.value()});
    } else if (saved.contains(item.key())) {
      adapter.module_tensors.push_back({item.key(), item.value()});
    } else if (item.value().requires_grad()) {
      not_adapters.push_back(item.key());
    }
  }
  // A tied parameter the model does not hold, written as PEFT writes it with ensure_weight_tying, so
  // that PEFT ties it to the saved module as this model reads it (a tied head its trained embedding).
  for (const tied_parameter& tie : tied) {
    if (const named_tensor* source = find_named(adapter.module_tensors, tie.reads)) {
      adapter.module_tensors.push_back({tie.name, source->tensor});
      adapter.ensure_weight_tying = true;
    }
  }
  if (!not_adapters.empty()) {
    throw_error<std::logic_error>(
        "job.save_adapter(): trainable(...) also trains {} ({}), which a PEFT LoRA adapter carries only as "
        "lora(...)'s modules_to_save: a model loading it would keep its own values for them. Save them as "
        "lora(r, targets, {{.modules_to_save = {{...}}}}), or the whole model with job.save_weights() as well",
        counted(static_cast<std::int64_t>(not_adapters.size()), "parameter"), fmt::join(not_adapters, ", "));
  }
  std::sort(adapter.target_modules.begin(), adapter.target_modules.end());
  return adapter;
}

void copy_peft_adapter_into(const lora_layers& lora, torch::nn::Module& module, const peft_lora_adapter& adapter,
                            const std::filesystem::path& path, std::span<const tied_parameter> tied) {
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
  // The modules to save: each of the plan's parameters from the file, a tied one the model does not
  // hold equal to what it reads.
  const std::map<std::string, at::Tensor> saved = saved_module_parameters(lora, module);
  std::set<std::string> missing_modules;
  for (const auto& [name, tensor] : saved) missing_modules.insert(name);
  std::set<std::string> unexpected_modules;
  for (const named_tensor& t : adapter.module_tensors) {
    const auto found = saved.find(t.name);
    if (found != saved.end()) {
      missing_modules.erase(t.name);
      if (found->second.sizes() != t.tensor.sizes()) {
        refuse(fmt::format("'{}' is [{}] in the adapter's modules_to_save but [{}] in the model", t.name,
                           fmt::join(t.tensor.sizes(), ", "), fmt::join(found->second.sizes(), ", ")));
      }
      continue;
    }
    const auto tie = std::find_if(tied.begin(), tied.end(), [&](const tied_parameter& p) { return p.name == t.name; });
    const named_tensor* source = tie == tied.end() ? nullptr : find_named(adapter.module_tensors, tie->reads);
    if (source == nullptr) {
      unexpected_modules.insert(t.name);
    } else if (!at::equal(source->tensor, t.tensor)) {
      refuse(fmt::format("'{}' differs from '{}' in the adapter, but this model's {} reads {} (they are tied)", t.name,
                         tie->reads, tie->name, tie->reads));
    }
  }
  if (!missing_modules.empty() || !unexpected_modules.empty()) {
    refuse(
        fmt::format("its modules to save differ from the plan's: missing [{}], unexpected [{}] (the adapter's "
                    "modules_to_save [{}], the plan's {})",
                    fmt::join(missing_modules, ", "), fmt::join(unexpected_modules, ", "),
                    fmt::join(adapter.modules_to_save, ", "), detail::to_text(lora.modules_to_save())));
  }
  torch::NoGradGuard no_grad;
  for (const named_tensor& t : adapter.tensors) mine.at(t.name).copy_(t.tensor);
  for (const named_tensor& t : adapter.module_tensors) {
    if (const auto found = saved.find(t.name); found != saved.end()) found->second.copy_(t.tensor);
  }
}

}  // namespace loom

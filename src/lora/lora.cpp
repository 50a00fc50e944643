#include <loom/lora/lora.hpp>

#include <loom/base/spelling.hpp>
#include <loom/base/text.hpp>
#include <loom/dsl/describe.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/init.h>

#include <algorithm>
#include <cmath>
#include <regex>
#include <set>
#include <stdexcept>

namespace loom {
namespace {

bool is_linear(const torch::nn::Module& module) {
  return dynamic_cast<const nn::LinearImpl*>(&module) != nullptr ||
         dynamic_cast<const torch::nn::LinearImpl*>(&module) != nullptr;
}

std::vector<std::string> linear_layer_names(torch::nn::Module& root) {
  std::vector<std::string> names;
  for (const auto& item : root.named_modules("", /*include_self=*/false)) {
    if (is_linear(*item.value())) names.push_back(item.key());
  }
  return names;
}

// What a name target may be for `layers`: each layer's dotted endings and whole name, the shortest
// first ("q_proj", then "attn.q_proj", ...), each once; what a misspelt target is compared with.
std::vector<std::string> target_spellings(const std::vector<std::string>& layers) {
  std::vector<std::pair<std::size_t, std::string>> endings;  // its number of parts, the ending
  for (const std::string& name : layers) {
    std::size_t parts = 1;
    for (std::size_t dot = name.rfind('.'); dot != std::string::npos && dot > 0; dot = name.rfind('.', dot - 1)) {
      endings.emplace_back(parts++, name.substr(dot + 1));
    }
    endings.emplace_back(parts, name);
  }
  std::stable_sort(endings.begin(), endings.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> spellings;
  std::set<std::string> seen;
  for (auto& [parts, ending] : endings) {
    if (seen.insert(ending).second) spellings.push_back(std::move(ending));
  }
  return spellings;
}

// The targets of a lora(...) that matched nothing, each with the layer names close to it:
// "'q_prj' (did you mean 'q_proj'?) names none".
std::string unmatched_targets(const target_list& targets, const std::vector<std::string>& layers) {
  const std::vector<std::string> spellings = target_spellings(layers);
  std::vector<std::string> named;
  for (const target& each : targets) {
    const std::string text(each.text);
    named.push_back(fmt::format("'{}'{}", text, each.kind == target_kind::name ? did_you_mean(text, spellings) : ""));
  }
  if (named.size() == 1) return named.front() + " names none";
  const std::string last = named.back();
  named.pop_back();
  return fmt::format("{} and {} name none", fmt::join(named, ", "), last);
}

// `targets` with each name target that is, or ends with, an alias standing for the alias's module.
target_list resolved(const target_list& targets, std::span<const target_alias> aliases) {
  target_list result;
  for (const target& each : targets) {
    std::string text(each.text);
    for (const target_alias& alias : aliases) {
      if (each.kind == target_kind::name && matches(target(alias.alias), text)) {
        text = text.substr(0, text.size() - alias.alias.size()).append(alias.name);
        break;
      }
    }
    result.push_back(target(text, each.kind));
  }
  return result;
}

// Sets the parameters of every module under `root` that `selector` selects trainable; whether any did.
bool train_modules(torch::nn::Module& root, const target& selector) {
  bool selected = false;
  for (const auto& module : root.named_modules("", /*include_self=*/false)) {
    if (!matches(selector, module.key())) continue;
    for (auto& parameter : module.value()->parameters()) parameter.set_requires_grad(true);
    selected = true;
  }
  return selected;
}

// "a, b, c, ... (N more)": the modules under `root`, for a message about one that was not found.
std::string module_names(torch::nn::Module& root) {
  std::vector<std::string> names;
  for (const auto& module : root.named_modules("", /*include_self=*/false)) names.push_back(module.key());
  return some_of(names);
}

}  // namespace

bool matches(const target& target, std::string_view name) {
  if (target.kind == target_kind::all_linear) return false;  // a layer's kind, not its name: inject's to judge
  if (target.kind == target_kind::pattern) {
    return std::regex_match(name.begin(), name.end(), std::regex(target.text.begin(), target.text.end()));
  }
  if (name == target.text) return true;
  return name.size() > target.text.size() && name.ends_with(target.text) &&
         name[name.size() - target.text.size() - 1] == '.';
}

bool matches_any(const target_list& targets, std::string_view name) {
  for (const target& t : targets) {
    if (matches(t, name)) return true;
  }
  return false;
}

lora_layers lora_layers::inject(torch::nn::Module& root, std::string_view model_name, const lora_stage& spec,
                                std::optional<at::ScalarType> compute_dtype, lora_model_names names) {
  lora_layers layers;
  layers.rules_ = lora_scaling_rules::of(spec);
  layers.dropout_ = spec.dropout();
  layers.modules_to_save_ = spec.modules_to_save();
  const target_list targets = resolved(spec.targets(), names.aliases);
  const target_list exclude = resolved(spec.exclude(), names.aliases);
  const bool all_linear_layers = targets.size() == 1 && targets[0].kind == target_kind::all_linear;
  for (const auto& item : root.named_modules("", /*include_self=*/false)) {
    const std::string& name = item.key();
    const std::shared_ptr<torch::nn::Module>& module = item.value();
    const bool selected =
        all_linear_layers ? is_linear(*module) && name != names.output_embeddings : matches_any(targets, name);
    if (!selected || matches_any(exclude, name)) continue;
    const lora_scaling_rules::layer settings = layers.rules_.for_layer(name);
    const lora_adapter_options adapter{settings.rank, settings.scaling, spec.dropout(), compute_dtype};
    if (auto fast = std::dynamic_pointer_cast<nn::LinearImpl>(module)) {
      fast->add_adapter(adapter);
      layers.fast_.push_back(fast);
    } else if (auto plain = std::dynamic_pointer_cast<torch::nn::LinearImpl>(module)) {
      if (spec.dropout() > 0) {
        throw_error<std::invalid_argument>(
            "lora dropout {} needs loom::nn::Linear, but '{}' is a torch::nn::Linear, whose adapter runs "
            "as an effective weight W + scale·B·A that cannot drop the adapter's input alone: build the model "
            "with loom::nn::Linear, or set dropout to 0",
            spec.dropout(), name);
      }
      auto added = lora_adapter::attach(*plain, plain->options.in_features(), plain->options.out_features(), adapter);
      layers.fallback_.push_back({plain, plain->weight, std::move(added)});
    } else {
      throw_error<std::invalid_argument>(
          "lora target selects '{}', a {}, which is not a linear layer: LoRA adapts torch::nn::Linear "
          "and loom::nn::Linear; target the linear layers inside it or add it to lora_options::exclude",
          name, module->name());
    }
    layers.adapted_.push_back(name);
  }
  if (layers.adapted_.empty()) {
    const std::vector<std::string> linear = linear_layer_names(root);
    if (linear.empty()) {
      throw_error<std::invalid_argument>(
          "lora(targets={}) matched no layer of {}, which has no linear layer: LoRA adapts torch::nn::Linear and "
          "loom::nn::Linear; build the model with them, or leave lora(...) out of the plan",
          detail::to_text(spec.targets()), model_name);
    }
    const std::string& example = linear.front();
    throw_error<std::invalid_argument>(
        "lora(targets={}) matched no layer of {}: {} of its linear layers, which are {}; name one of them, the end "
        "of its dotted name (e.g. '{}'), or a loom::pattern(\"regex\")",
        detail::to_text(spec.targets()), model_name, unmatched_targets(spec.targets(), linear), some_of(linear),
        example.substr(example.rfind('.') + 1));
  }
  return layers;
}

lora_layers::forward_guard::forward_guard(lora_layers& layers) : layers_(layers) {
  if (layers_.merged_) return;
  for (fallback_layer& f : layers_.fallback_) {
    f.layer->weight = f.adapter.effective_weight(f.base_weight);
  }
}

lora_layers::forward_guard::~forward_guard() {
  for (fallback_layer& f : layers_.fallback_) f.layer->weight = f.base_weight;
}

void lora_layers::merge() {
  if (merged_) return;
  for (auto& layer : fast_) layer->merge();
  for (fallback_layer& f : fallback_) f.adapter.merge_into(f.base_weight);
  merged_ = true;
}

void lora_layers::unmerge() {
  if (!merged_) return;
  for (auto& layer : fast_) layer->unmerge();
  for (fallback_layer& f : fallback_) f.adapter.unmerge_from(f.base_weight);
  merged_ = false;
}

bool lora_layers::saves(std::string_view parameter) const {
  for (std::size_t dot = parameter.rfind('.'); dot != std::string_view::npos && dot > 0;
       dot = parameter.rfind('.', dot - 1)) {
    if (matches_any(modules_to_save_, parameter.substr(0, dot))) return true;
  }
  return false;
}

void lora_layers::train_modules_to_save(torch::nn::Module& root, std::string_view model_name,
                                        std::span<const tied_parameter> tied) const {
  for (const target& name : modules_to_save_) {
    if (train_modules(root, name)) continue;
    const auto tie = std::find_if(tied.begin(), tied.end(), [&](const tied_parameter& p) {
      return matches(name, p.name.substr(0, p.name.rfind('.')));
    });
    if (tie != tied.end()) {
      throw_error<std::invalid_argument>(
          "lora modules_to_save '{}' selects no module of {}: its {} reads {} (they are tied); save '{}' instead, "
          "which then trains for both, and the saved adapter keeps the tie (PEFT's ensure_weight_tying)",
          name.text, model_name, tie->name, tie->reads, tie->reads.substr(0, tie->reads.rfind('.')));
    }
    throw_error<std::invalid_argument>("lora modules_to_save '{}' selects no module of {}; its modules are: {}",
                                       name.text, model_name, module_names(root));
  }
}

void set_trainable(torch::nn::Module& root, std::string_view model_name, bool has_lora, const target_list& patterns) {
  if (has_lora) {
    for (const auto& item : root.named_parameters()) {
      item.value().set_requires_grad(lora_adapter::is_adapter_parameter(item.key()));
    }
  }
  for (const target& pattern : patterns) {
    bool selected = train_modules(root, pattern);
    for (const auto& parameter : root.named_parameters()) {
      if (!matches(pattern, parameter.key())) continue;
      parameter.value().set_requires_grad(true);
      selected = true;
    }
    if (!selected) {
      throw_error<std::invalid_argument>(
          "trainable pattern '{}' selects no module or parameter of {}; its modules are: {}", pattern.text, model_name,
          module_names(root));
    }
  }
}

}  // namespace loom

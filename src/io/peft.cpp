#include <loom/io/peft.hpp>

#include <loom/base/text.hpp>
#include <loom/io/files.hpp>
#include <loom/io/safetensors.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string_view>
#include <type_traits>
#include <utility>

namespace loom {
namespace {

// Ordered: rank_pattern's and alpha_pattern's first matching key wins, so their order is kept.
using json = nlohmann::ordered_json;

constexpr std::string_view config_file = "adapter_config.json";
constexpr std::string_view weights_file = "adapter_model.safetensors";
constexpr std::string_view key_prefix = "base_model.model.";
constexpr std::string_view key_suffix = ".weight";
// diffusers' names for its LoRA file and the header's key that carries the LoraConfig
// (diffusers/loaders/lora_base.py: LORA_WEIGHT_NAME_SAFE, LORA_ADAPTER_METADATA_KEY).
constexpr std::string_view diffusers_file = "pytorch_lora_weights.safetensors";
constexpr std::string_view diffusers_metadata_key = "lora_adapter_metadata";

// Where a LoRA config and its tensors come from, as a refusal names them.
struct origin {
  std::string what;    // "the PEFT adapter in '<folder>'"
  std::string config;  // where its config is: "adapter_config.json"
};

// An integral alpha is written as an integer, as PEFT's own configs carry it.
json number(double value) {
  if (std::floor(value) == value && std::abs(value) < 1e15) return static_cast<std::int64_t>(value);
  return value;
}

json string_or_null(const std::string& value) { return value.empty() ? json(nullptr) : json(value); }

void write_text(const std::filesystem::path& path, const std::string& text) {
  atomic_file out(path);
  out.write(text.data(), text.size());
  out.commit();
}

[[noreturn]] void refuse(const origin& from, const std::string& reason) {
  throw_error<peft_error>("{} {}", from.what, reason);
}

// Whether a config value is absent, null or empty: PEFT writes defaults as null, {} or [].
bool unset(const json& config, const char* key) {
  const auto found = config.find(key);
  return found == config.end() || found->is_null() || (found->is_structured() && found->empty());
}

// "a number", "an array", ...: what a JSON value is, for a message.
std::string kind_of(const json& value) {
  const std::string_view name = value.type_name();
  return fmt::format("{} {}", name.find_first_of("aeiou") == 0 ? "an" : "a", name);
}

// The config's value for `key`, or `fallback` when it is absent or null (PEFT writes an unset option
// as null); refused when it is of another kind than T: a bool, a string or a number (double).
template <class T>
T setting(const origin& from, const json& config, const char* key, T fallback) {
  const auto found = config.find(key);
  if (found == config.end() || found->is_null()) return fallback;
  const auto [fits, kind] = std::is_same_v<T, bool>          ? std::pair{found->is_boolean(), "true or false"}
                            : std::is_same_v<T, std::string> ? std::pair{found->is_string(), "a string"}
                                                             : std::pair{found->is_number(), "a number"};
  if (!fits) refuse(from, fmt::format("has {} for {} in {}, not {}", kind_of(*found), key, from.config, kind));
  return found->template get<T>();
}

// {key: value, ...} in the adapter's order.
template <class Value>
json patterns(const std::vector<std::pair<std::string, Value>>& entries) {
  json object = json::object();
  for (const auto& [key, value] : entries) object[key] = number(static_cast<double>(value));
  return object;
}

// PEFT's LoraConfig of `adapter`, as its to_dict() holds it: adapter_config.json, and what diffusers
// builds a LoraConfig from.
json lora_config(const peft_lora_adapter& adapter) {
  json config = {
      {"peft_type", "LORA"},
      {"task_type", string_or_null(adapter.task_type)},
      {"r", adapter.r},
      {"lora_alpha", number(adapter.lora_alpha)},
      {"lora_dropout", adapter.lora_dropout},
      {"target_modules", adapter.target_modules},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"init_lora_weights", true},
      {"inference_mode", true},
      {"use_rslora", adapter.use_rslora},
      {"use_dora", false},
      {"modules_to_save", adapter.modules_to_save.empty() ? json(nullptr) : json(adapter.modules_to_save)},
      {"ensure_weight_tying", adapter.ensure_weight_tying},
      {"layers_to_transform", nullptr},
      {"layers_pattern", nullptr},
      {"rank_pattern", patterns(adapter.rank_pattern)},
      {"alpha_pattern", patterns(adapter.alpha_pattern)},
      {"base_model_name_or_path", string_or_null(adapter.base_model_name_or_path)},
      {"revision", nullptr},
  };
  if (adapter.task_type.empty() && !adapter.base_model_class.empty() && !adapter.parent_library.empty()) {
    config["auto_mapping"] = {{"base_model_class", adapter.base_model_class},
                              {"parent_library", adapter.parent_library}};
  }
  return config;
}

// rank_pattern's or alpha_pattern's keys and numbers, in the file's order; none when unset.
std::vector<std::pair<std::string, double>> pattern_entries(const origin& from, const json& config, const char* key) {
  std::vector<std::pair<std::string, double>> entries;
  if (unset(config, key)) return entries;
  const json& object = config[key];
  if (!object.is_object())
    refuse(from, fmt::format("has {} for {} in {}, not an object", kind_of(object), key, from.config));
  for (const auto& [name, value] : object.items()) {
    if (!value.is_number()) {
      refuse(from, fmt::format("has {} for {} '{}' in {}, not a number", kind_of(value), key, name, from.config));
    }
    entries.emplace_back(name, value.get<double>());
  }
  return entries;
}

json parsed_config(const std::string& text, const origin& from) {
  json config;
  try {
    config = json::parse(text);
  } catch (const json::exception& error) {
    refuse(from, fmt::format("has a {} that is not JSON ({})", from.config, error.what()));
  }
  if (!config.is_object()) refuse(from, fmt::format("has a {} that is not a JSON object", from.config));
  return config;
}

// The adapter `config` describes, without its tensors; refused, with the reason, where a plain LoRA
// adapter cannot express it.
peft_lora_adapter read_lora_config(const json& config, const origin& from) {
  const std::string type = setting(from, config, "peft_type", std::string());
  if (type != "LORA") refuse(from, fmt::format("is of peft_type '{}', not LORA", type));
  if (!config.contains("r") || !config["r"].is_number_integer() || config["r"].get<std::int64_t>() <= 0) {
    refuse(from, "has no positive integer r");
  }
  if (!config.contains("lora_alpha") || !config["lora_alpha"].is_number()) refuse(from, "has no numeric lora_alpha");
  if (setting(from, config, "use_dora", false)) {
    refuse(from, "is a DoRA adapter (use_dora), which plain LoRA cannot express");
  }
  if (setting(from, config, "fan_in_fan_out", false)) refuse(from, "stores transposed weights (fan_in_fan_out)");
  const std::string bias = setting(from, config, "bias", std::string("none"));
  if (bias != "none") {
    refuse(from, fmt::format("trains biases (bias '{}'), which a LoRA adapter file of loom's cannot carry", bias));
  }

  peft_lora_adapter adapter;
  adapter.r = config["r"].get<std::int64_t>();
  adapter.lora_alpha = config["lora_alpha"].get<double>();
  adapter.lora_dropout = setting(from, config, "lora_dropout", 0.0);
  adapter.use_rslora = setting(from, config, "use_rslora", false);
  adapter.ensure_weight_tying = setting(from, config, "ensure_weight_tying", false);
  if (!unset(config, "modules_to_save")) {
    const json& modules = config["modules_to_save"];
    if (!modules.is_array()) {
      refuse(from, fmt::format("has {} for modules_to_save in {}, not a list of names", kind_of(modules), from.config));
    }
    for (const json& name : modules) {
      if (!name.is_string()) {
        refuse(from, fmt::format("has {} among modules_to_save in {}, not only names", kind_of(name), from.config));
      }
      adapter.modules_to_save.push_back(name.get<std::string>());
    }
  }
  for (const auto& [key, value] : pattern_entries(from, config, "rank_pattern")) {
    if (value < 1 || value != std::floor(value)) {
      refuse(from, fmt::format("has rank_pattern '{}': {} in {}, not a positive whole rank", key, value, from.config));
    }
    adapter.rank_pattern.emplace_back(key, static_cast<std::int64_t>(value));
  }
  for (const auto& [key, value] : pattern_entries(from, config, "alpha_pattern")) {
    if (!(value > 0))
      refuse(from, fmt::format("has alpha_pattern '{}': {} in {}, not a positive alpha", key, value, from.config));
    adapter.alpha_pattern.emplace_back(key, value);
  }
  adapter.task_type = setting(from, config, "task_type", std::string());
  adapter.base_model_name_or_path = setting(from, config, "base_model_name_or_path", std::string());
  if (!(adapter.lora_dropout >= 0 && adapter.lora_dropout <= 1)) {
    refuse(from,
           fmt::format("has lora_dropout {} in {}, not a probability in [0, 1]", adapter.lora_dropout, from.config));
  }
  // A list of names, or a string (a regular expression, or "all-linear") that names no layer itself.
  if (const auto targets = config.find("target_modules"); targets != config.end() && targets->is_array()) {
    for (const json& target : *targets) {
      if (!target.is_string()) {
        refuse(from, fmt::format("has {} among target_modules in {}, not only names", kind_of(target), from.config));
      }
      adapter.target_modules.push_back(target.get<std::string>());
    }
  } else if (targets != config.end() && !targets->is_string() && !targets->is_null()) {
    refuse(from, fmt::format("has {} for target_modules in {}, not a list of names", kind_of(*targets), from.config));
  }
  return adapter;
}

// The tensors under the file's keys: "<prefix><layer>.lora_A.weight", and a module to save's
// parameters under their own names, "<prefix>model.embed_tokens.weight" (PEFT's, without
// "modules_to_save.<adapter>.").
std::vector<named_tensor> keyed(const peft_lora_adapter& adapter, std::string_view prefix) {
  std::vector<named_tensor> out;
  for (const named_tensor& t : adapter.tensors) {
    out.push_back({fmt::format("{}{}{}", prefix, t.name, key_suffix), t.tensor});
  }
  for (const named_tensor& t : adapter.module_tensors) out.push_back({fmt::format("{}{}", prefix, t.name), t.tensor});
  return out;
}

// The tensors of a file under the module's names: "<layer>.lora_A" and "<layer>.lora_B" into the
// adapter's tensors, and, when it has modules_to_save, every other key into its module tensors.
void read_tensors(peft_lora_adapter& adapter, std::vector<named_tensor> file_tensors, std::string_view prefix,
                  const origin& from) {
  for (named_tensor& t : file_tensors) {
    const std::string_view key = t.name;
    const bool prefixed = key.starts_with(prefix) && key.size() > prefix.size();
    const bool weight = prefixed && key.size() > prefix.size() + key_suffix.size() && key.ends_with(key_suffix);
    const std::string_view name =
        weight ? key.substr(prefix.size(), key.size() - prefix.size() - key_suffix.size()) : std::string_view();
    if (name.ends_with(".lora_A") || name.ends_with(".lora_B")) {
      adapter.tensors.push_back({std::string(name), std::move(t.tensor)});
    } else if (prefixed && !adapter.modules_to_save.empty()) {
      adapter.module_tensors.push_back({std::string(key.substr(prefix.size())), std::move(t.tensor)});
    } else if (!weight) {
      refuse(from, fmt::format("holds '{}', not a key of the form {}<layer>.lora_A{}", t.name, prefix, key_suffix));
    } else {
      refuse(from, fmt::format("holds '{}', which is not a lora_A or lora_B weight, and saves no modules "
                               "(modules_to_save)",
                               t.name));
    }
  }
}

// What diffusers makes of a LoRA file without its config: the rank from the shapes, one for every
// layer, alpha equal to it (a scale of 1), and the adapted layers from the keys.
void read_config_from_shapes(peft_lora_adapter& adapter, const origin& from) {
  std::set<std::string> layers;
  std::map<std::int64_t, std::string> ranks;  // a layer of each rank, for the message
  for (const named_tensor& t : adapter.tensors) {
    const std::string layer = t.name.substr(0, t.name.size() - std::string_view(".lora_A").size());
    layers.insert(layer);
    if (t.tensor.dim() == 2) ranks.emplace(t.name.ends_with(".lora_A") ? t.tensor.size(0) : t.tensor.size(1), layer);
  }
  if (ranks.size() != 1) {
    std::vector<std::string> listed;
    for (const auto& [rank, layer] : ranks) listed.push_back(fmt::format("{} of rank {}", layer, rank));
    refuse(from, fmt::format("has no {} and {}, so its rank cannot be told from its shapes", diffusers_metadata_key,
                             ranks.empty() ? "no two-dimensional lora_A or lora_B"
                                           : fmt::format("layers of several ranks ({})", fmt::join(listed, ", "))));
  }
  adapter.r = ranks.begin()->first;
  adapter.lora_alpha = static_cast<double>(adapter.r);
  adapter.target_modules.assign(layers.begin(), layers.end());
}

}  // namespace

void save_peft_adapter(const std::filesystem::path& folder, const peft_lora_adapter& adapter) {
  std::filesystem::create_directories(folder);
  save_safetensors(folder / weights_file, keyed(adapter, key_prefix), {{"format", "pt"}});
  write_text(folder / config_file, lora_config(adapter).dump(2) + "\n");
}

peft_lora_adapter load_peft_adapter(const std::filesystem::path& folder) {
  const origin from{fmt::format("the PEFT adapter in '{}'", folder.string()), std::string(config_file)};
  std::ifstream in(folder / config_file);
  if (!in) {
    refuse(from, std::filesystem::exists(folder / diffusers_file)
                     ? fmt::format("has no {} but diffusers' {}: read that with loom::adapter_format::diffusers",
                                   config_file, diffusers_file)
                     : fmt::format("has no readable {}", config_file));
  }
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  peft_lora_adapter adapter = read_lora_config(parsed_config(text, from), from);
  read_tensors(adapter, load_safetensors(folder / weights_file).tensors, key_prefix, from);
  return adapter;
}

void save_diffusers_lora(const std::filesystem::path& folder, const peft_lora_adapter& adapter,
                         std::string_view component) {
  std::filesystem::create_directories(folder);
  const std::string prefix = fmt::format("{}.", component);
  const json config = lora_config(adapter);
  json metadata = json::object();
  for (const auto& [key, value] : config.items()) metadata[prefix + key] = value;
  save_safetensors(folder / diffusers_file, keyed(adapter, prefix),
                   {{"format", "pt"}, {std::string(diffusers_metadata_key), metadata.dump(2)}});
}

peft_lora_adapter load_diffusers_lora(const std::filesystem::path& path, std::string_view component) {
  const bool folder = std::filesystem::is_directory(path);
  const std::filesystem::path file = folder ? path / diffusers_file : path;
  const origin from{fmt::format("the diffusers LoRA file '{}'", file.string()), std::string(diffusers_metadata_key)};
  if (folder && !std::filesystem::exists(file)) {
    throw_error<peft_error>("'{}' holds no {}{}", path.string(), diffusers_file,
                            std::filesystem::exists(path / config_file)
                                ? fmt::format(" but PEFT's {}: read that with loom::adapter_format::peft", config_file)
                                : "");
  }
  safetensors_content content = load_safetensors(file);
  const std::string prefix = fmt::format("{}.", component);
  const auto metadata = content.metadata.find(std::string(diffusers_metadata_key));
  if (metadata == content.metadata.end()) {
    peft_lora_adapter adapter;
    read_tensors(adapter, std::move(content.tensors), prefix, from);
    read_config_from_shapes(adapter, from);
    return adapter;
  }
  // Each key under the pipeline's name for its model, as diffusers strips it before LoraConfig(**...).
  const json prefixed = parsed_config(metadata->second, from);
  json config = json::object();
  for (const auto& [key, value] : prefixed.items()) {
    if (key.starts_with(prefix)) config[key.substr(prefix.size())] = value;
  }
  if (config.empty()) refuse(from, fmt::format("has {} with no key under '{}'", diffusers_metadata_key, prefix));
  peft_lora_adapter adapter = read_lora_config(config, from);
  read_tensors(adapter, std::move(content.tensors), prefix, from);
  return adapter;
}

}  // namespace loom

#include <loom/io/peft.hpp>

#include <loom/base/text.hpp>
#include <loom/io/files.hpp>
#include <loom/io/safetensors.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <string_view>
#include <type_traits>
#include <utility>

namespace loom {
namespace {

using json = nlohmann::json;

constexpr std::string_view config_file = "adapter_config.json";
constexpr std::string_view weights_file = "adapter_model.safetensors";
constexpr std::string_view key_prefix = "base_model.model.";
constexpr std::string_view key_suffix = ".weight";

// An integral alpha is written as an integer, as PEFT's own configs carry it.
json number(double value) {
  if (std::floor(value) == value && std::abs(value) < 1e15) return static_cast<std::int64_t>(value);
  return value;
}

void write_text(const std::filesystem::path& path, const std::string& text) {
  atomic_file out(path);
  out.write(text.data(), text.size());
  out.commit();
}

[[noreturn]] void refuse(const std::filesystem::path& folder, const std::string& reason) {
  throw_error<peft_error>("the PEFT adapter in '{}' {}", folder.string(), reason);
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
T setting(const std::filesystem::path& folder, const json& config, const char* key, T fallback) {
  const auto found = config.find(key);
  if (found == config.end() || found->is_null()) return fallback;
  const auto [fits, kind] = std::is_same_v<T, bool>          ? std::pair{found->is_boolean(), "true or false"}
                            : std::is_same_v<T, std::string> ? std::pair{found->is_string(), "a string"}
                                                             : std::pair{found->is_number(), "a number"};
  if (!fits) refuse(folder, fmt::format("has {} for {} in {}, not {}", kind_of(*found), key, config_file, kind));
  return found->template get<T>();
}

}  // namespace

void save_peft_adapter(const std::filesystem::path& folder, const peft_lora_adapter& adapter) {
  std::filesystem::create_directories(folder);
  const json config = {
      {"peft_type", "LORA"},
      {"task_type", adapter.task_type.empty() ? json(nullptr) : json(adapter.task_type)},
      {"r", adapter.r},
      {"lora_alpha", number(adapter.lora_alpha)},
      {"lora_dropout", adapter.lora_dropout},
      {"target_modules", adapter.target_modules},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"init_lora_weights", true},
      {"inference_mode", true},
      {"use_rslora", false},
      {"use_dora", false},
      {"modules_to_save", nullptr},
      {"layers_to_transform", nullptr},
      {"layers_pattern", nullptr},
      {"rank_pattern", json::object()},
      {"alpha_pattern", json::object()},
      {"base_model_name_or_path",
       adapter.base_model_name_or_path.empty() ? json(nullptr) : json(adapter.base_model_name_or_path)},
      {"revision", nullptr},
  };
  std::vector<named_tensor> keyed;
  for (const named_tensor& t : adapter.tensors) {
    keyed.push_back({std::string(key_prefix) + t.name + std::string(key_suffix), t.tensor});
  }
  save_safetensors(folder / weights_file, keyed, {{"format", "pt"}});
  write_text(folder / config_file, config.dump(2) + "\n");
}

peft_lora_adapter load_peft_adapter(const std::filesystem::path& folder) {
  const std::filesystem::path config_path = folder / config_file;
  std::ifstream in(config_path);
  if (!in) refuse(folder, fmt::format("has no readable {}", config_file));
  json config;
  try {
    config = json::parse(in);
  } catch (const json::exception& error) {
    refuse(folder, fmt::format("has a {} that is not JSON ({})", config_file, error.what()));
  }
  if (!config.is_object()) refuse(folder, fmt::format("has a {} that is not a JSON object", config_file));
  const std::string type = setting(folder, config, "peft_type", std::string());
  if (type != "LORA") refuse(folder, fmt::format("is of peft_type '{}', not LORA", type));
  if (!config.contains("r") || !config["r"].is_number_integer() || config["r"].get<std::int64_t>() <= 0) {
    refuse(folder, "has no positive integer r");
  }
  if (!config.contains("lora_alpha") || !config["lora_alpha"].is_number()) refuse(folder, "has no numeric lora_alpha");
  if (setting(folder, config, "use_dora", false)) {
    refuse(folder, "is a DoRA adapter (use_dora), which plain LoRA cannot express");
  }
  if (setting(folder, config, "use_rslora", false)) {
    refuse(folder, "uses rsLoRA's scaling alpha / sqrt(r) (use_rslora); loom's LoRA scales by alpha / r");
  }
  if (setting(folder, config, "fan_in_fan_out", false)) refuse(folder, "stores transposed weights (fan_in_fan_out)");
  const std::string bias = setting(folder, config, "bias", std::string("none"));
  if (bias != "none") {
    refuse(folder, fmt::format("trains biases (bias '{}'), which a LoRA adapter file of loom's cannot carry", bias));
  }
  for (const char* key : {"rank_pattern", "alpha_pattern"}) {
    if (!unset(config, key)) refuse(folder, fmt::format("sets {}: a rank or alpha per layer", key));
  }
  if (!unset(config, "modules_to_save")) refuse(folder, "saves whole modules beside the adapters (modules_to_save)");

  peft_lora_adapter adapter;
  adapter.r = config["r"].get<std::int64_t>();
  adapter.lora_alpha = config["lora_alpha"].get<double>();
  adapter.lora_dropout = setting(folder, config, "lora_dropout", 0.0);
  adapter.task_type = setting(folder, config, "task_type", std::string());
  adapter.base_model_name_or_path = setting(folder, config, "base_model_name_or_path", std::string());
  if (!(adapter.lora_dropout >= 0 && adapter.lora_dropout <= 1)) {
    refuse(folder,
           fmt::format("has lora_dropout {} in {}, not a probability in [0, 1]", adapter.lora_dropout, config_file));
  }
  // A list of names, or a string (a regular expression, or "all-linear") that names no layer itself.
  if (const auto targets = config.find("target_modules"); targets != config.end() && targets->is_array()) {
    for (const json& target : *targets) {
      if (!target.is_string()) {
        refuse(folder, fmt::format("has {} among target_modules in {}, not only names", kind_of(target), config_file));
      }
      adapter.target_modules.push_back(target.get<std::string>());
    }
  } else if (targets != config.end() && !targets->is_string() && !targets->is_null()) {
    refuse(folder, fmt::format("has {} for target_modules in {}, not a list of names", kind_of(*targets), config_file));
  }
  for (named_tensor& t : load_safetensors(folder / weights_file).tensors) {
    const std::string_view key = t.name;
    if (key.size() < key_prefix.size() + key_suffix.size() || !key.starts_with(key_prefix) ||
        !key.ends_with(key_suffix)) {
      refuse(folder,
             fmt::format("holds '{}', not a key of the form {}<layer>.lora_A{}", t.name, key_prefix, key_suffix));
    }
    std::string name(key.substr(key_prefix.size(), key.size() - key_prefix.size() - key_suffix.size()));
    if (!name.ends_with(".lora_A") && !name.ends_with(".lora_B")) {
      refuse(folder, fmt::format("holds '{}', which is not a lora_A or lora_B weight", t.name));
    }
    adapter.tensors.push_back({std::move(name), std::move(t.tensor)});
  }
  return adapter;
}

}  // namespace loom

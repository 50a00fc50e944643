#include <loom/io/peft.hpp>

#include <loom/io/files.hpp>
#include <loom/io/safetensors.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <string_view>

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
  throw peft_error(fmt::format("loom: the PEFT adapter in '{}' {}", folder.string(), reason));
}

// Whether a config value is absent, null or empty: PEFT writes defaults as null, {} or [].
bool unset(const json& config, const char* key) {
  return !config.contains(key) || config[key].is_null() || (config[key].is_structured() && config[key].empty());
}

}  // namespace

void save_peft_adapter(const std::filesystem::path& folder, const peft_lora_adapter& adapter) {
  std::filesystem::create_directories(folder);
  const json config = {
      {"peft_type", "LORA"},
      {"task_type", nullptr},
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
      {"base_model_name_or_path", nullptr},
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
  const std::string type = config.value("peft_type", std::string());
  if (type != "LORA") refuse(folder, fmt::format("is of peft_type '{}', not LORA", type));
  if (!config.contains("r") || !config["r"].is_number_integer() || config["r"].get<std::int64_t>() <= 0) {
    refuse(folder, "has no positive integer r");
  }
  if (!config.contains("lora_alpha") || !config["lora_alpha"].is_number()) refuse(folder, "has no numeric lora_alpha");
  if (config.value("use_dora", false)) refuse(folder, "is a DoRA adapter (use_dora), which plain LoRA cannot express");
  if (config.value("use_rslora", false)) {
    refuse(folder, "uses rsLoRA's scaling alpha / sqrt(r) (use_rslora); loom's LoRA scales by alpha / r");
  }
  if (config.value("fan_in_fan_out", false)) refuse(folder, "stores transposed weights (fan_in_fan_out)");
  if (config.value("bias", std::string("none")) != "none") {
    refuse(folder, fmt::format("trains biases (bias '{}'), which a LoRA adapter file of loom's cannot carry",
                               config["bias"].get<std::string>()));
  }
  for (const char* key : {"rank_pattern", "alpha_pattern"}) {
    if (!unset(config, key)) refuse(folder, fmt::format("sets {}: a rank or alpha per layer", key));
  }
  if (!unset(config, "modules_to_save")) refuse(folder, "saves whole modules beside the adapters (modules_to_save)");

  peft_lora_adapter adapter;
  adapter.r = config["r"].get<std::int64_t>();
  adapter.lora_alpha = config["lora_alpha"].get<double>();
  adapter.lora_dropout = config.value("lora_dropout", 0.0);
  if (config.contains("target_modules") && config["target_modules"].is_array()) {
    adapter.target_modules = config["target_modules"].get<std::vector<std::string>>();
  }
  for (named_tensor& t : load_safetensors(folder / weights_file).tensors) {
    const std::string_view key = t.name;
    if (!key.starts_with(key_prefix) || !key.ends_with(key_suffix)) {
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

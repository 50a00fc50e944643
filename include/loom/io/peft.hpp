#pragma once
// PEFT's LoRA adapter folder, as PeftModel.save_pretrained writes it and PeftModel.from_pretrained
// reads it: adapter_config.json (peft_type "LORA", r, lora_alpha, lora_dropout, target_modules,
// ...) and adapter_model.safetensors, whose keys are "base_model.model.<layer>.lora_A.weight"
// ([r, in]) and "base_model.model.<layer>.lora_B.weight" ([out, r]).

#include <loom/runtime/tensors.hpp>

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace loom {

// A PEFT folder that loom cannot read as a plain LoRA adapter: names the folder and the reason.
class peft_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct peft_lora_adapter {
  std::int64_t r = 0;
  double lora_alpha = 0;  // as given: a fractional alpha stays fractional
  double lora_dropout = 0;
  std::vector<std::string> target_modules;  // the adapted layers' full dotted names
  // What AutoPeftModel*.from_pretrained(folder) needs to load the base model itself: PEFT's task
  // ("CAUSAL_LM") and the base model's folder; null in the file when empty.
  std::string task_type;
  std::string base_model_name_or_path;
  // Under the module's names: "<layer>.lora_A" and "<layer>.lora_B".
  std::vector<named_tensor> tensors;
};

// Writes adapter_config.json and adapter_model.safetensors into `folder` (created if missing), each
// file atomically.
void save_peft_adapter(const std::filesystem::path& folder, const peft_lora_adapter& adapter);

// Reads a LoRA adapter that PEFT (or loom) saved; refuses, with the reason, what a plain LoRA
// adapter cannot express: another peft_type, DoRA, rsLoRA's scaling, trained biases, per-layer
// ranks or alphas, modules_to_save.
[[nodiscard]] peft_lora_adapter load_peft_adapter(const std::filesystem::path& folder);

}  // namespace loom

#pragma once
// A LoRA adapter in the two files the ecosystem reads:
// - PEFT's folder, as PeftModel.save_pretrained writes it and PeftModel.from_pretrained reads it:
//   adapter_config.json (peft_type "LORA", r, lora_alpha, lora_dropout, target_modules, ...) and
//   adapter_model.safetensors, whose keys are "base_model.model.<layer>.lora_A.weight" ([r, in]) and
//   "base_model.model.<layer>.lora_B.weight" ([out, r]);
// - diffusers' file, as a pipeline's save_lora_weights writes it and its load_lora_weights (or the
//   model's load_lora_adapter) reads it: pytorch_lora_weights.safetensors, whose keys are the same
//   tensors' under the pipeline's name for the model ("transformer.<layer>.lora_A.weight"), with
//   PEFT's LoraConfig in the header's metadata, each key under that name too ("transformer.r"), from
//   which diffusers builds the adapter's config rather than guessing it from the shapes.

#include <loom/runtime/tensors.hpp>

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom {

// Which of those files: job.save_adapter(folder, format) and job.load_adapter(path, format).
enum class adapter_format { peft, diffusers };

// An adapter file that loom cannot read as a plain LoRA adapter: names the file or folder and the reason.
class peft_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct peft_lora_adapter {
  std::int64_t r = 0;
  double lora_alpha = 0;  // as given: a fractional alpha stays fractional
  double lora_dropout = 0;
  bool use_rslora = false;  // scaled by lora_alpha / √r, not lora_alpha / r
  // Per-layer ranks and alphas by key (a name, or a regex of a name's end), in the file's order.
  std::vector<std::pair<std::string, std::int64_t>> rank_pattern{};
  std::vector<std::pair<std::string, double>> alpha_pattern{};
  // Whole modules trained beside the adapters, as named in the config, and their parameters' tensors
  // under the model's names ("model.embed_tokens.weight"); with ensure_weight_tying, a tied one too.
  std::vector<std::string> modules_to_save{};
  bool ensure_weight_tying = false;
  std::vector<named_tensor> module_tensors{};
  std::vector<std::string> target_modules;  // the adapted layers' full dotted names
  // What AutoPeftModel*.from_pretrained(folder) needs to load the base model itself: PEFT's task
  // ("CAUSAL_LM") and the base model's folder; null in the file when empty.
  std::string task_type;
  std::string base_model_name_or_path;
  // For a model without a task (a diffusers model), the class AutoPeftModel loads the base model
  // with and its Python module, as PEFT's auto_mapping names them; written only, when both are given.
  std::string base_model_class{};
  std::string parent_library{};
  // Under the module's names: "<layer>.lora_A" and "<layer>.lora_B".
  std::vector<named_tensor> tensors;
};

// Writes adapter_config.json and adapter_model.safetensors into `folder` (created if missing), each
// file atomically.
void save_peft_adapter(const std::filesystem::path& folder, const peft_lora_adapter& adapter);

// Reads a LoRA adapter that PEFT (or loom) saved; refuses, with the reason, what loom's LoRA cannot
// express: another peft_type, DoRA, trained biases.
[[nodiscard]] peft_lora_adapter load_peft_adapter(const std::filesystem::path& folder);

// Writes pytorch_lora_weights.safetensors into `folder` (created if missing), atomically: the keys and
// the LoraConfig's under `component`, the pipeline's name for the model ("transformer").
void save_diffusers_lora(const std::filesystem::path& folder, const peft_lora_adapter& adapter,
                         std::string_view component);

// Reads diffusers' LoRA file (`path`, or pytorch_lora_weights.safetensors in the folder `path`), its
// keys under `component`; refuses what load_peft_adapter refuses. Without the LoraConfig in its
// header (a file of older diffusers), it reads as diffusers does: the rank from the shapes, one for
// every layer, and lora_alpha equal to it.
[[nodiscard]] peft_lora_adapter load_diffusers_lora(const std::filesystem::path& path, std::string_view component);

}  // namespace loom

#pragma once
// The plan's LoRA adapters as PEFT's LoRA adapter (loom/io/peft.hpp), both ways: what of a module a
// PEFT folder can carry, and whether an adapter read from one fits the plan's lora(...) before it
// is copied in, so that a model loading it (PEFT, or loom) computes what this one trained. The
// messages name job.save_adapter() and job.load_adapter(), the calls a user makes to reach them.

#include <loom/io/peft.hpp>
#include <loom/lora/lora.hpp>

#include <torch/nn/module.h>

#include <filesystem>
#include <string>

namespace loom {

// The adapters of `module` that `lora` injected, with the plan's rank, alpha and dropout, naming
// for PEFT `task_type` ("CAUSAL_LM") and `base_model` (the base model's folder), each empty for none.
// Throws std::logic_error when a parameter other than an adapter trains: a model loading the adapter
// would keep its own values for it.
[[nodiscard]] peft_lora_adapter to_peft_adapter(const lora_layers& lora, const torch::nn::Module& module,
                                                std::string task_type, std::string base_model);

// Copies `adapter`, read from `folder`, into the adapters of `module` that `lora` injected, once it is
// checked against them: the plan's rank and alpha, and each of the module's adapter tensors, by name
// and shape, no more and no fewer. std::invalid_argument names the folder and the first difference;
// nothing is copied then.
void copy_peft_adapter_into(const lora_layers& lora, torch::nn::Module& module, const peft_lora_adapter& adapter,
                            const std::filesystem::path& folder);

}  // namespace loom

#pragma once
// The plan's LoRA adapters as PEFT's LoRA adapter (loom/io/peft.hpp: PEFT's folder or diffusers'
// file), both ways: what of a module such a file can carry, and whether an adapter read from one
// fits the plan's lora(...) before it is copied in, so that a model loading it (PEFT, diffusers, or
// loom) computes what this one trained. The messages name job.save_adapter() and
// job.load_adapter(), the calls a user makes to reach them.

#include <loom/io/peft.hpp>
#include <loom/lora/lora.hpp>

#include <torch/nn/module.h>

#include <filesystem>
#include <span>
#include <string>

namespace loom {

// The adapters of `module` that `lora` injected, with the plan's rank, alpha, dropout and PEFT's
// options, and the parameters of its modules_to_save, each tied parameter that reads one of them
// written beside it with ensure_weight_tying (what names the base model is the caller's to fill in).
// Throws std::logic_error when another parameter trains: a model loading the adapter would keep its
// own values for it.
[[nodiscard]] peft_lora_adapter to_peft_adapter(const lora_layers& lora, const torch::nn::Module& module,
                                                std::span<const tied_parameter> tied = {});

// Copies `adapter`, read from `path` (a folder or a file), into the adapters of `module` that `lora`
// injected, once it is checked against them: the plan's rank and alpha, and each of the module's
// adapter tensors, by name and shape, no more and no fewer. std::invalid_argument names the path and
// the first difference; nothing is copied then.
void copy_peft_adapter_into(const lora_layers& lora, torch::nn::Module& module, const peft_lora_adapter& adapter,
                            const std::filesystem::path& path, std::span<const tied_parameter> tied = {});

}  // namespace loom

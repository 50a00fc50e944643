#pragma once
// The end of a LoRA recipe: the adapters written in PEFT's format, when the plan has a lora stage.

#include <loom/dsl/lora.hpp>

#include <fmt/core.h>

#include <filesystem>

namespace recipes {

// Every rank calls it; rank 0 says where the adapter went.
template <class Job, class Plan>
void save_adapter_if_adapted(Job& job, const Plan& plan, const std::filesystem::path& folder) {
  if (!plan.template find<loom::lora_stage>()) return;
  job.save_adapter(folder);
  if (job.rt().rank() == 0) fmt::print("saved {} (PEFT's LoRA format)\n", folder.string());
}

}  // namespace recipes

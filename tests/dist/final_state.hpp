#pragma once
// A rank's final state as the resume checks compare it (resume_runs.py's differences): the whole
// model and its AdamW state, each parameter's moments and step, in one safetensors file.

#include <loom/io/safetensors.hpp>
#include <loom/runtime/tensors.hpp>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/optim/adamw.h>

#include <cstddef>
#include <filesystem>

namespace loom::testing {

template <class Job>
void save_final_state(Job& job, const torch::optim::Optimizer& optimizer, const std::filesystem::path& file) {
  tensor_state final_state = job.state_dict();
  std::size_t index = 0;
  for (const at::Tensor& p : job.trainable_parameters()) {
    const auto& adamw =
        static_cast<const torch::optim::AdamWParamState&>(*optimizer.state().at(p.unsafeGetTensorImpl()));
    final_state.push_back({fmt::format("optimizer/{}/exp_avg", index), adamw.exp_avg()});
    final_state.push_back({fmt::format("optimizer/{}/exp_avg_sq", index), adamw.exp_avg_sq()});
    final_state.push_back({fmt::format("optimizer/{}/step", index), at::full({1}, adamw.step(), at::kDouble)});
    ++index;
  }
  save_safetensors(file, final_state);
}

}  // namespace loom::testing

#pragma once
// The bytes a rank holds in parameters, gradients and AdamW's state: every distinct live storage
// among the module's parameters, the optimizer's tensors, their gradients and the moments.

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include <cstdint>
#include <set>

namespace loom::testing {

template <class Job>
std::int64_t training_state_bytes(Job& job, torch::optim::Optimizer& optimizer) {
  std::set<const c10::StorageImpl*> seen;
  std::int64_t bytes = 0;
  const auto count = [&](const at::Tensor& t) {
    if (t.defined() && seen.insert(t.storage().unsafeGetStorageImpl()).second) {
      bytes += static_cast<std::int64_t>(t.storage().nbytes());
    }
  };
  for (const auto& p : job.module().parameters()) {
    count(p);
    count(p.grad());
  }
  for (const auto& p : job.trainable_parameters()) {
    count(p);
    count(p.grad());
  }
  for (const auto& [key, state] : optimizer.state()) {
    const auto& adamw = static_cast<const torch::optim::AdamWParamState&>(*state);
    count(adamw.exp_avg());
    count(adamw.exp_avg_sq());
  }
  return bytes;
}

}  // namespace loom::testing

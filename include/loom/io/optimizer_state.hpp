#pragma once
// An optimizer's per-parameter state seen field by field, for any torch::optim optimizer: through
// its own serialisation, the fields by name (AdamW: step, exp_avg, exp_avg_sq), tensors or numbers.

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace torch::optim {
class Optimizer;
class OptimizerParamState;
}  // namespace torch::optim

namespace loom {

using optimizer_fields = std::vector<std::pair<std::string, c10::IValue>>;

[[nodiscard]] optimizer_fields state_fields(const torch::optim::OptimizerParamState& state);
void set_state_fields(torch::optim::OptimizerParamState& state, const optimizer_fields& fields);

// A copy of `state` in tensors of its own, which the optimizer's next steps leave alone, each made
// by `copy` (a save's host staging): for the states of torch::optim's Adam, AdamW, SGD, Adagrad and
// RMSprop, tensor by tensor; nullptr for any other, whose fields only its serialisation knows.
[[nodiscard]] std::unique_ptr<torch::optim::OptimizerParamState> copied_state(
    const torch::optim::OptimizerParamState& state, const std::function<at::Tensor(const at::Tensor&)>& copy);

// The bytes of every tensor in the optimizer's state (moments, buffers), on this rank.
[[nodiscard]] std::int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer);

}  // namespace loom

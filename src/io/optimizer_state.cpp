#include <loom/io/optimizer_state.hpp>

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/archive.h>

#include <sstream>

namespace loom {

// One parameter's optimizer state as the optimizer serialises it: its fields by name (moments as
// tensors, a step as an integer), whatever the optimizer.
optimizer_fields state_fields(const torch::optim::OptimizerParamState& state) {
  torch::serialize::OutputArchive out;
  state.serialize(out);
  std::ostringstream bytes;
  out.save_to(bytes);
  const std::string text = bytes.str();
  torch::serialize::InputArchive in;
  in.load_from(text.data(), text.size());
  optimizer_fields fields;
  for (const std::string& key : in.keys()) {
    c10::IValue value;
    in.read(key, value);
    fields.emplace_back(key, std::move(value));
  }
  return fields;
}

void set_state_fields(torch::optim::OptimizerParamState& state, const optimizer_fields& fields) {
  torch::serialize::OutputArchive out;
  for (const auto& [key, value] : fields) out.write(key, value);
  std::ostringstream bytes;
  out.save_to(bytes);
  const std::string text = bytes.str();
  torch::serialize::InputArchive in;
  in.load_from(text.data(), text.size());
  state.serialize(in);
}

namespace {

// `state` copied when it is a State, `give_copies` then setting each of its tensor fields to a copy.
template <class State, class GiveCopies>
std::unique_ptr<torch::optim::OptimizerParamState> copied_as(const torch::optim::OptimizerParamState& state,
                                                             GiveCopies give_copies) {
  const auto* typed = dynamic_cast<const State*>(&state);
  if (typed == nullptr) return nullptr;
  auto copy = std::make_unique<State>(*typed);
  give_copies(*copy);
  return copy;
}

}  // namespace

std::unique_ptr<torch::optim::OptimizerParamState> copied_state(
    const torch::optim::OptimizerParamState& state, const std::function<at::Tensor(const at::Tensor&)>& copy) {
  namespace optim = torch::optim;
  const auto copy_of = [&copy](const at::Tensor& t) { return t.defined() ? copy(t) : t; };
  const auto adam_like = [&](auto& s) {
    s.exp_avg(copy_of(s.exp_avg())).exp_avg_sq(copy_of(s.exp_avg_sq())).max_exp_avg_sq(copy_of(s.max_exp_avg_sq()));
  };
  if (auto copied = copied_as<optim::AdamWParamState>(state, adam_like)) return copied;
  if (auto copied = copied_as<optim::AdamParamState>(state, adam_like)) return copied;
  if (auto copied =
          copied_as<optim::SGDParamState>(state, [&](auto& s) { s.momentum_buffer(copy_of(s.momentum_buffer())); })) {
    return copied;
  }
  if (auto copied = copied_as<optim::AdagradParamState>(state, [&](auto& s) { s.sum(copy_of(s.sum())); })) {
    return copied;
  }
  return copied_as<optim::RMSpropParamState>(state, [&](auto& s) {
    s.square_avg(copy_of(s.square_avg())).momentum_buffer(copy_of(s.momentum_buffer())).grad_avg(copy_of(s.grad_avg()));
  });
}

std::int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer) {
  std::int64_t bytes = 0;
  for (const auto& [key, state] : optimizer.state()) {
    (void)key;
    for (const auto& [name, value] : state_fields(*state)) {
      if (value.isTensor()) bytes += static_cast<std::int64_t>(value.toTensor().nbytes());
    }
  }
  return bytes;
}

}  // namespace loom

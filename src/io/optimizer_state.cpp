#include <loom/io/optimizer_state.hpp>

#include <torch/optim/optimizer.h>
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

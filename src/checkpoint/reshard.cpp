// Resharding (docs/checkpoints.md): a sharded checkpoint loaded over another number of ranks or
// another shard group, each rank taking its rows of one whole copy's shards, for the parameters and
// for the optimizer's per-element state.
#include <loom/checkpoint/checkpoint.hpp>

#include "optimizer_bytes.hpp"

#include <loom/base/text.hpp>
#include <loom/io/optimizer_state.hpp>

#include <torch/optim/optimizer.h>

#include <map>
#include <string>
#include <vector>

namespace loom {
namespace {

using checkpoint_detail::load_optimizer;

}  // namespace

tensor_state checkpointer::resharded_model(const checkpoint_target& target, const std::vector<tensor_state>& old) {
  tensor_state mine;
  for (std::size_t i = 0; i < old.front().size(); ++i) {
    const std::string& name = old.front()[i].name;
    std::vector<at::Tensor> shards;
    for (const tensor_state& rank_state : old) {
      if (i >= rank_state.size() || rank_state[i].name != name) {
        throw_error<checkpoint_error>("the old ranks' files list different tensors at '{}'", name);
      }
      shards.push_back(rank_state[i].tensor);
    }
    // Sharded: this rank's rows of the old shards; whole on every rank (an adapter, a buffer): rank 0's.
    mine.push_back({name, target.reshard(name, shards).value_or(old.front()[i].tensor)});
  }
  return mine;
}

void checkpointer::load_resharded_optimizer(const checkpoint_target& target, torch::optim::Optimizer& optimizer,
                                            const std::vector<at::Tensor>& old) {
  std::vector<at::Tensor> parameters;
  for (const auto& group : optimizer.param_groups()) {
    for (const at::Tensor& p : group.params()) parameters.push_back(p);
  }
  if (parameters.size() != target.optimizer_names.size()) {
    throw_error<checkpoint_error>("the optimizer steps {} tensors, the job trains {}", parameters.size(),
                                  target.optimizer_names.size());
  }
  // Each old rank's state, loaded in turn (the optimizer maps it to the parameters by position), to
  // collect every field's shards.
  std::vector<std::map<std::string, std::vector<at::Tensor>>> shards(parameters.size());
  for (const at::Tensor& bytes : old) {
    load_optimizer(optimizer, bytes);
    for (std::size_t j = 0; j < parameters.size(); ++j) {
      const auto state = optimizer.state().find(parameters[j].unsafeGetTensorImpl());
      if (state == optimizer.state().end()) continue;
      for (const auto& [key, value] : state_fields(*state->second)) {
        if (value.isTensor()) shards[j][key].push_back(value.toTensor().clone());
      }
    }
  }
  // Rank 0's state for the options and every field that is not per element (a step), then this
  // rank's rows of each field laid out as its parameter.
  load_optimizer(optimizer, old.front());
  for (std::size_t j = 0; j < parameters.size(); ++j) {
    const auto state = optimizer.state().find(parameters[j].unsafeGetTensorImpl());
    if (state == optimizer.state().end()) continue;
    auto fields = state_fields(*state->second);
    for (auto& [key, value] : fields) {
      const auto field = shards[j].find(key);
      if (field == shards[j].end() || field->second.size() != old.size()) continue;
      if (auto mine = target.reshard(target.optimizer_names[j], field->second)) value = *mine;
    }
    set_state_fields(*state->second, fields);
  }
}

}  // namespace loom

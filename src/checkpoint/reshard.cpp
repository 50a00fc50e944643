// Resharding (docs/checkpoints.md): a checkpoint saved in another layout, each tensor put together
// whole from one copy's files and this rank's part of it taken, for the parameters and for the
// optimizer's per-element state.
#include "reshard.hpp"

#include "optimizer_bytes.hpp"

#include <loom/base/text.hpp>
#include <loom/io/optimizer_state.hpp>

#include <ATen/ATen.h>
#include <fmt/ranges.h>
#include <torch/optim/optimizer.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace loom::checkpoint_detail {
namespace {

// `name` whole from one copy's tensors of it (`saved_of(i)`: copy rank i's): for each slice the data-
// parallel ranks' rows of it joined, then the slices joined along the split dimension. A sharding
// strategy's file holds its rows flat, rank-major and padded at the end (FSDP2's dim-0 shards); a
// tensor of the slice's own shape is the slice itself, whole on every data-parallel rank.
at::Tensor whole_of(const std::string& name, const tensor_layout& layout, const saved_layout& saved,
                    const std::function<const at::Tensor&(int)>& saved_of) {
  std::vector<std::int64_t> slice_shape = layout.shape;
  const auto split = saved.split_dims.find(name);
  const int slices = split != saved.split_dims.end() ? saved.tensor_parallel : 1;
  if (slices > 1) {
    if (split->second < 0 || split->second >= static_cast<std::int64_t>(slice_shape.size()) ||
        slice_shape[static_cast<std::size_t>(split->second)] % slices != 0) {
      throw_error<checkpoint_error>(
          "it split '{}' of shape [{}] along dimension {} over tensor_parallel({}), which "
          "this model's '{}' cannot have been",
          name, fmt::join(layout.shape, ", "), split->second, slices, name);
    }
    slice_shape[static_cast<std::size_t>(split->second)] /= slices;
  }
  std::int64_t numel = 1;
  for (const std::int64_t size : slice_shape) numel *= size;
  std::vector<at::Tensor> parts;
  for (int t = 0; t < slices; ++t) {
    if (saved_of(t).sizes().equals(slice_shape)) {
      parts.push_back(saved_of(t));
      continue;
    }
    std::vector<at::Tensor> rows;
    for (int d = 0; d < saved.shard_group; ++d) rows.push_back(saved_of(d * saved.tensor_parallel + t).reshape(-1));
    const at::Tensor joined = at::cat(rows);
    if (joined.numel() < numel) {
      throw_error<checkpoint_error>("its shards of '{}' hold {} values, fewer than the {} of [{}]", name,
                                    joined.numel(), numel, fmt::join(slice_shape, ", "));
    }
    parts.push_back(joined.narrow(0, 0, numel).view(slice_shape));
  }
  return parts.size() == 1 ? parts.front() : at::cat(parts, split->second);
}

const tensor_layout& layout_of(const std::map<std::string, tensor_layout>& layouts, const std::string& name) {
  const auto found = layouts.find(name);
  if (found == layouts.end()) throw_error<checkpoint_error>("the checkpoint holds '{}', which this model lacks", name);
  return found->second;
}

}  // namespace

saved_layout saved_layout::of(const checkpoint_manifest& manifest, bool strategy_shards) {
  return {.tensor_parallel = manifest.tensor_parallel,
          .shard_group = strategy_shards && manifest.sharded ? manifest.shard_group_size : 1,
          .split_dims = {}};
}

std::string split_dims_text(const std::map<std::string, tensor_layout>& layouts) {
  nlohmann::json dims = nlohmann::json::object();
  for (const auto& [name, layout] : layouts) {
    if (layout.split_dim) dims[name] = *layout.split_dim;
  }
  return dims.dump();
}

std::map<std::string, std::int64_t> split_dims_of(const std::string& text) {
  const nlohmann::json dims = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!dims.is_object()) throw_error<checkpoint_error>("its record of the split tensors is not a JSON object");
  std::map<std::string, std::int64_t> split;
  for (const auto& [name, dim] : dims.items()) {
    if (!dim.is_number_unsigned()) {
      throw_error<checkpoint_error>("its record of the split tensors gives '{}' no dimension", name);
    }
    split.emplace(name, dim.get<std::int64_t>());
  }
  return split;
}

std::vector<int> saved_layout::copy_ranks() const {
  std::vector<int> ranks;
  for (int rank = 0; rank < shard_group * tensor_parallel; ++rank) ranks.push_back(rank);
  return ranks;
}

tensor_state resharded_model(const checkpoint_target& target, const saved_layout& saved,
                             const std::vector<tensor_state>& old_ranks) {
  const std::map<std::string, tensor_layout> layouts = target.whole_layouts();
  tensor_state mine;
  for (std::size_t i = 0; i < old_ranks.front().size(); ++i) {
    const std::string& name = old_ranks.front()[i].name;
    for (const tensor_state& rank_state : old_ranks) {
      if (i >= rank_state.size() || rank_state[i].name != name) {
        throw_error<checkpoint_error>("the old ranks' files list different tensors at '{}'", name);
      }
    }
    const at::Tensor whole = whole_of(name, layout_of(layouts, name), saved, [&](int rank) -> const at::Tensor& {
      return old_ranks[static_cast<std::size_t>(rank)][i].tensor;
    });
    mine.push_back({name, target.local_part(name, whole)});
  }
  return mine;
}

void load_resharded_optimizer(const checkpoint_target& target, const saved_layout& saved,
                              torch::optim::Optimizer& optimizer, const std::vector<tensor_state>& old_ranks,
                              const std::vector<at::Tensor>& old_archives) {
  std::vector<at::Tensor> parameters;
  for (const auto& group : optimizer.param_groups()) {
    for (const at::Tensor& p : group.params()) parameters.push_back(p);
  }
  if (parameters.size() != target.optimizer_names.size()) {
    throw_error<checkpoint_error>("the optimizer steps {} tensors, the job trains {}", parameters.size(),
                                  target.optimizer_names.size());
  }
  // Each old rank's state, loaded in turn (the optimizer maps it to the parameters by position), to
  // collect every field's values on each.
  std::vector<std::map<std::string, std::vector<at::Tensor>>> saved_fields(parameters.size());
  for (const at::Tensor& bytes : old_archives) {
    load_optimizer(optimizer, bytes);
    for (std::size_t j = 0; j < parameters.size(); ++j) {
      const auto state = optimizer.state().find(parameters[j].unsafeGetTensorImpl());
      if (state == optimizer.state().end()) continue;
      for (const auto& [key, value] : state_fields(*state->second)) {
        if (value.isTensor()) saved_fields[j][key].push_back(value.toTensor().clone());
      }
    }
  }
  // A field is per element when rank 0 holds it in its parameter's shape there.
  std::map<std::string, at::IntArrayRef> saved_shapes;
  for (const named_tensor& t : old_ranks.front()) saved_shapes.emplace(t.name, t.tensor.sizes());
  const std::map<std::string, tensor_layout> layouts = target.whole_layouts();
  // Rank 0's state for the options and every field that is not per element (a step), then this
  // rank's part of each field that is.
  load_optimizer(optimizer, old_archives.front());
  for (std::size_t j = 0; j < parameters.size(); ++j) {
    const auto state = optimizer.state().find(parameters[j].unsafeGetTensorImpl());
    if (state == optimizer.state().end()) continue;
    const std::string& name = target.optimizer_names[j];
    const auto shape = saved_shapes.find(name);
    auto fields = state_fields(*state->second);
    for (auto& [key, value] : fields) {
      const auto field = saved_fields[j].find(key);
      if (field == saved_fields[j].end() || field->second.size() != old_archives.size()) continue;
      if (shape == saved_shapes.end() || !field->second.front().sizes().equals(shape->second)) continue;
      const at::Tensor whole = whole_of(name, layout_of(layouts, name), saved, [&](int rank) -> const at::Tensor& {
        return field->second[static_cast<std::size_t>(rank)];
      });
      value = target.local_part(name, whole);
    }
    set_state_fields(*state->second, fields);
  }
}

}  // namespace loom::checkpoint_detail

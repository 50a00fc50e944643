#include <loom/strategies/fsdp/param_group.hpp>

#include <loom/runtime/failpoints.hpp>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <map>

namespace loom::sharding {

std::vector<std::vector<std::size_t>> param_group::batches(bool trainable_only) const {
  std::map<c10::ScalarType, std::vector<std::size_t>> by_dtype;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (!trainable_only || params_[i].trainable()) by_dtype[params_[i].full().scalar_type()].push_back(i);
  }
  std::vector<std::vector<std::size_t>> batches;
  for (auto& [dtype, indices] : by_dtype) batches.push_back(std::move(indices));
  return batches;
}

std::vector<schedule_entry> param_group::gather_entries(step_phase phase) const {
  std::vector<schedule_entry> entries;
  for (const auto& indices : batches(false)) {
    schedule_entry& entry = entries.emplace_back(schedule_entry{collective_op::all_gather, phase, {}, "world"});
    for (std::size_t i : indices) entry.tensors.push_back(params_[i].shard_spec());
  }
  return entries;
}

std::vector<schedule_entry> param_group::reduce_scatter_entries() const {
  std::vector<schedule_entry> entries;
  for (const auto& indices : batches(true)) {
    schedule_entry& entry =
        entries.emplace_back(schedule_entry{collective_op::reduce_scatter, step_phase::backward, {}, "world"});
    for (std::size_t i : indices) entry.tensors.push_back(params_[i].shard_spec());
  }
  return entries;
}

void param_group::start_gather(collectives& comm) {
  for (auto& indices : batches(false)) {
    std::vector<at::Tensor> shards;
    for (std::size_t i : indices) shards.push_back(params_[i].shard().detach());
    at::Tensor packed = at::cat(shards);
    at::Tensor all = at::empty({comm.world_size(), packed.numel()}, packed.options());
    pending_collective work = comm.all_gather(packed, all);
    gathers_.push_back({std::move(indices), std::move(all), std::move(work)});
  }
}

void param_group::finish_gather() {
  if (gathers_.empty()) return;  // none issued: whole already, or left at rest
  for (in_flight& gather : gathers_) {
    gather.work.wait();
    std::int64_t offset = 0;
    for (std::size_t i : gather.indices) {
      const sharded_param& p = params_[i];
      p.unshard_from(gather.buffer.narrow(1, offset, p.shard_numel()));
      offset += p.shard_numel();
    }
  }
  gathers_.clear();
  gathered_ = true;
}

void param_group::gather_now(collectives& comm) {
  start_gather(comm);
  finish_gather();
}

void param_group::reshard() {
  if (!gathered_) return;
  for (const sharded_param& p : params_) p.release();
  gathered_ = false;
}

void param_group::start_reduce_scatter(collectives& comm) {
  const std::int64_t world = comm.world_size();
  for (auto& indices : batches(true)) {
    const auto flags = static_cast<std::int64_t>(indices.size());
    std::int64_t per_rank = flags;
    for (std::size_t i : indices) per_rank += params_[i].shard_numel();
    const at::Tensor input = at::zeros({world, per_rank}, params_[indices.front()].shard().options());
    std::int64_t offset = 0;
    for (std::size_t k = 0; k < indices.size(); ++k) {
      const sharded_param& p = params_[indices[k]];
      if (p.move_grad_into(input.narrow(1, offset, p.shard_numel()))) {
        input.select(1, per_rank - flags + static_cast<std::int64_t>(k)).fill_(1);
      }
      offset += p.shard_numel();
    }
    at::Tensor output = at::empty({per_rank}, input.options());
    pending_collective work = comm.reduce_scatter(input.view(-1), output, reduce_op::mean);
    failpoint("step.backward");  // mid backward, with a reduce-scatter under way
    reductions_.push_back({std::move(indices), std::move(output), std::move(work)});
  }
}

void param_group::finish_reduce_scatter() {
  for (in_flight& reduction : reductions_) {
    reduction.work.wait();
    const at::Tensor& reduced = reduction.buffer;
    const auto flags = static_cast<std::int64_t>(reduction.indices.size());
    // Which parameters had a gradient on some rank: a few flags, read on the host.
    const at::Tensor used_by = reduced.narrow(0, reduced.numel() - flags, flags).to(at::kDouble).cpu();
    const auto* used = used_by.const_data_ptr<double>();
    std::int64_t offset = 0;
    for (std::size_t k = 0; k < reduction.indices.size(); ++k) {
      const sharded_param& p = params_[reduction.indices[k]];
      // A gradient after the reduce-scatter began would be lost: never silently.
      TORCH_CHECK(!p.full().grad().defined(), "loom: fsdp(): '", p.name(), "' received a gradient after ", name_,
                  "'s reduce-scatter began. fsdp() reduces a unit's gradients once the gradient of the previous "
                  "unit's output is complete, which holds when the units form a chain (each unit's output feeds "
                  "the next, as a transformer's blocks do); hold units whose backward passes interleave as one unit");
      if (used[k] > 0) p.accumulate_grad(reduced.narrow(0, offset, p.shard_numel()));
      offset += p.shard_numel();
    }
  }
  reductions_.clear();
}

}  // namespace loom::sharding

#include <loom/strategies/fsdp/param_group.hpp>

#include <loom/runtime/failpoints.hpp>

#include <ATen/ATen.h>

#include <algorithm>
#include <map>

namespace loom::sharding {

at::ScalarType param_group::carried_dtype(std::size_t i, bool reduction) const {
  const at::ScalarType computed = params_[i].full().scalar_type();
  return reduction ? reduce_.value_or(computed) : computed;
}

std::vector<std::vector<std::size_t>> param_group::batches(bool reduction) const {
  std::map<c10::ScalarType, std::vector<std::size_t>> by_dtype;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (!reduction || params_[i].trainable()) by_dtype[carried_dtype(i, reduction)].push_back(i);
  }
  std::vector<std::vector<std::size_t>> batches;
  for (auto& [dtype, indices] : by_dtype) batches.push_back(std::move(indices));
  return batches;
}

std::vector<schedule_entry> param_group::entries(collective_op op, step_phase phase, bool reduction,
                                                 const std::string& group) const {
  std::vector<schedule_entry> entries;
  for (const auto& indices : batches(reduction)) {
    schedule_entry& entry = entries.emplace_back(schedule_entry{op, phase, {}, group});
    for (std::size_t i : indices) {
      entry.tensors.push_back({params_[i].name(), {params_[i].shard_numel()}, carried_dtype(i, reduction)});
    }
  }
  return entries;
}

std::vector<schedule_entry> param_group::gather_entries(step_phase phase, const std::string& group) const {
  return entries(collective_op::all_gather, phase, false, group);
}

std::vector<schedule_entry> param_group::reduce_scatter_entries(const std::string& group) const {
  return entries(collective_op::reduce_scatter, step_phase::backward, true, group);
}

std::vector<schedule_entry> param_group::replicate_entries(const std::string& group) const {
  return entries(collective_op::all_reduce, step_phase::backward, true, group);
}

void param_group::start_gather(collectives& comm) {
  for (auto& indices : batches(false)) {
    std::vector<at::Tensor> shards;
    // Cast to what the parameters compute in: mixed precision's gathers move half the bytes.
    for (std::size_t i : indices) shards.push_back(params_[i].shard().detach().to(carried_dtype(i, false)));
    at::Tensor packed = at::cat(shards);
    at::Tensor all = at::empty({comm.world_size(), packed.numel()}, packed.options());
    pending_collective work = comm.all_gather(packed, all);
    gathers_.push_back({std::move(indices), std::move(all), std::move(work), {}});
  }
}

void param_group::finish_gather() {
  if (gathers_.empty()) return;  // none issued: whole already, or left at rest
  if (!whole_) {
    for (const sharded_param& p : params_) p.alloc_storage();
  }
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
  whole_ = true;
}

void param_group::reshard() {
  if (!whole_) return;
  for (const sharded_param& p : params_) p.free_storage();
  whole_ = false;
}

void param_group::start_reduce_scatter(collectives& comm) {
  for (auto& indices : batches(true)) {
    std::vector<std::int64_t> sizes;
    for (std::size_t i : indices) sizes.push_back(params_[i].shard_numel());
    flagged_gradients layout(std::move(sizes));
    const at::Tensor input = layout.pack(
        comm.world_size(), params_[indices.front()].shard().options().dtype(carried_dtype(indices.front(), true)),
        [&](std::size_t k, const at::Tensor& by_rank) { return params_[indices[k]].move_grad_into(by_rank); });
    at::Tensor output = at::empty({layout.row_numel()}, input.options());
    pending_collective work = comm.reduce_scatter(input.view(-1), output, reduce_op::mean);
    failpoint("step.backward");  // mid backward, with a reduce-scatter under way
    reductions_.push_back({std::move(indices), std::move(output), std::move(work), std::move(layout)});
  }
}

const sharded_param* param_group::late_gradient() const {
  for (const in_flight& reduction : reductions_) {
    for (std::size_t i : reduction.indices) {
      if (params_[i].full().grad().defined()) return &params_[i];
    }
  }
  return nullptr;
}

bool param_group::reduce_scatter_done() const {
  return std::all_of(reductions_.begin(), reductions_.end(),
                     [](const in_flight& reduction) { return reduction.work.is_completed(); });
}

void param_group::start_replicate_all_reduce(collectives& replicate) {
  for (in_flight& reduction : reductions_) {
    reduction.work.wait();
    reduction.work = replicate.all_reduce(reduction.buffer, reduce_op::mean);
  }
}

void param_group::finish_reduce_scatter() {
  for (in_flight& reduction : reductions_) {
    reduction.work.wait();
    reduction.layout.unpack(reduction.buffer, [&](std::size_t k, const at::Tensor& reduced) {
      params_[reduction.indices[k]].accumulate_grad(reduced);
    });
  }
  reductions_.clear();
}

void param_group::stash_grads() {
  if (!reduce_) return;
  for (sharded_param& p : params_) {
    if (p.trainable()) p.stash_grad(*reduce_);
  }
}

std::vector<at::Tensor> param_group::gather_masters(collectives& comm) const {
  std::map<c10::ScalarType, std::vector<std::size_t>> by_dtype;
  for (std::size_t i = 0; i < params_.size(); ++i) by_dtype[params_[i].shard().scalar_type()].push_back(i);
  std::vector<at::Tensor> masters(params_.size());
  for (const auto& [dtype, indices] : by_dtype) {
    std::vector<at::Tensor> shards;
    for (std::size_t i : indices) shards.push_back(params_[i].shard().detach());
    const at::Tensor packed = at::cat(shards);
    at::Tensor all = at::empty({comm.world_size(), packed.numel()}, packed.options());
    comm.all_gather(packed, all).wait();
    std::int64_t offset = 0;
    for (std::size_t i : indices) {
      masters[i] = params_[i].whole_from(all.narrow(1, offset, params_[i].shard_numel()));
      offset += params_[i].shard_numel();
    }
  }
  return masters;
}

void param_group::hold_masters(collectives& comm) {
  const std::vector<at::Tensor> masters = gather_masters(comm);
  for (std::size_t i = 0; i < params_.size(); ++i) params_[i].hold_whole(masters[i]);
}

void param_group::request_rows(int rank, std::vector<nn::row_request>& requests) const {
  for (const sharded_param& p : params_) {
    if (auto request = p.rows_request(rank)) requests.push_back(std::move(*request));
  }
}

void param_group::come_to_rest() {
  for (const sharded_param& p : params_) p.release_full();
  whole_ = false;
}

void param_group::release_masters(int rank) {
  for (const sharded_param& p : params_) p.release_whole(rank);
  whole_ = false;
}

}  // namespace loom::sharding

#include <loom/strategies/fsdp/param_group.hpp>

#include <loom/base/text.hpp>
#include <loom/runtime/failpoints.hpp>

#include <ATen/ATen.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string_view>
#include <utility>

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

at::Tensor param_group::packed_shards(const std::vector<std::size_t>& indices) const {
  std::vector<at::Tensor> shards;
  for (std::size_t i : indices) shards.push_back(params_[i].shard().detach());
  return at::cat(shards);
}

// The host writes no offloaded shard while a copy in may read it: the optimizer steps after the
// backward's end has waited for the device (fsdp_state::end_backward), by when every gather's copies
// are done (the compute stream waited for each gather, each gather for its copies).
at::Tensor param_group::copied_in(const std::vector<std::size_t>& indices) const {
  std::int64_t numel = 0;
  for (std::size_t i : indices) numel += params_[i].shard_numel();
  const sharded_param& first = params_[indices.front()];
  at::Tensor packed = at::empty({numel}, first.shard().options().device(first.full().device()).requires_grad(false));
  std::int64_t offset = 0;
  for (std::size_t i : indices) {
    const std::int64_t count = params_[i].shard_numel();
    packed.narrow(0, offset, count).copy_(params_[i].shard().detach(), /*non_blocking=*/true);
    offset += count;
  }
  return packed;
}

// The copy-in stream waits for the current one, where the optimizer wrote the shards; the bytes it
// allocates are freed only once the compute stream has waited for the gather and copied out of
// them, and taken again only after the next such wait: no event needs to outlive a call.
void param_group::start_gather(collectives& comm, const comm_streams& streams) {
  const comm_streams::scope copy_in = streams.enter(comm_role::gather_copy_in);
  for (auto& indices : batches(false)) {
    // One kernel to pack, and one more under mixed precision to cast to what the parameters compute
    // in, so that its gathers move half the bytes. Offloaded shards are packed by their copies in,
    // one a shard, each from pinned host memory without blocking, on this stream.
    const at::ScalarType carried = carried_dtype(indices.front(), false);
    const at::Tensor packed =
        params_[indices.front()].offloaded() ? copied_in(indices).to(carried) : packed_shards(indices).to(carried);
    at::Tensor all = at::empty({comm.world_size(), packed.numel()}, packed.options());
    const comm_streams::scope gather = streams.enter(comm_role::gather);
    pending_collective work = comm.all_gather(packed, all);
    gathers_.push_back({std::move(indices), std::move(all), std::move(work), {}, {}});
  }
}

namespace {

std::string_view name_of(group_state state) {
  switch (state) {
    case group_state::unsharded: return "unsharded";
    case group_state::sharded: return "sharded";
    case group_state::holding_masters: return "holding the master weights";
  }
  return "?";
}

std::string_view name_of(group_move move) {
  switch (move) {
    case group_move::gather: return "a gather";
    case group_move::reshard: return "a reshard";
    case group_move::come_to_rest: return "coming to rest";
    case group_move::hold_masters: return "holding the master weights";
    case group_move::release_masters: return "releasing the master weights";
  }
  return "?";
}

}  // namespace

void param_group::make(group_move move) {
  if (!may_start(move, state_)) {
    throw_error<std::logic_error>("fsdp(): group '{}' cannot start {} while {} (a bug in loom: please report it)",
                                  name_, name_of(move), name_of(state_));
  }
  state_ = after(move);
}

void param_group::finish_gather() {
  if (gathers_.empty()) return;  // none issued: whole already, or left at rest
  const bool was_sharded = state_ == group_state::sharded;
  make(group_move::gather);
  if (was_sharded) {
    for (const sharded_param& p : params_) p.alloc_storage();
  }
  for (in_flight& gather : gathers_) {
    gather.work.wait();
    // One kernel (on CUDA) writes every parameter's rank-major blocks, padding included, into its bytes.
    std::vector<at::Tensor> destinations;
    std::vector<std::int64_t> sizes;
    for (std::size_t i : gather.indices) {
      destinations.push_back(params_[i].gathered_rows());
      sizes.push_back(params_[i].shard_numel());
    }
    at::split_with_sizes_copy_out(destinations, gather.buffer, sizes, 1);
  }
  gathers_.clear();
}

void param_group::reshard() {
  const bool was_unsharded = state_ == group_state::unsharded;
  make(group_move::reshard);
  if (was_unsharded) {
    for (const sharded_param& p : params_) p.free_storage();
  }
}

void param_group::start_reduce_scatter(collectives& comm, const comm_streams& streams) {
  const std::int64_t ranks = comm.world_size();
  for (auto& indices : batches(true)) {
    const at::TensorOptions options =
        params_[indices.front()].shard().options().dtype(carried_dtype(indices.front(), true)).requires_grad(false);
    std::vector<at::Tensor> grads;
    std::vector<const sharded_param*> sent;
    std::int64_t row_numel = 0;
    for (std::size_t i : indices) {
      at::Tensor grad = params_[i].take_grad();
      if (params_[i].shard_numel() == 0) continue;  // an empty parameter: nothing to send
      grads.push_back(std::move(grad));
      sent.push_back(&params_[i]);
      row_numel += params_[i].shard_numel();
    }
    // Each gradient's rows split into the ranks' blocks, zero-padded, rank-major: the layout the
    // reduce-scatter hands out, written by one kernel (FSDP2's _chunk_cat), cast on the way. Its
    // inputs share one dtype: a gradient of another (what stash_grad kept), or none, is made so.
    at::Tensor input = at::zeros({ranks, row_numel}, options);
    if (row_numel > 0) {
      const auto computed = std::find_if(grads.begin(), grads.end(), [](const at::Tensor& g) { return g.defined(); });
      const at::ScalarType dtype = computed != grads.end() ? computed->scalar_type() : options.dtype().toScalarType();
      for (std::size_t k = 0; k < grads.size(); ++k) {
        if (!grads[k].defined()) grads[k] = at::zeros({sent[k]->rows(), sent[k]->row_numel()}, options.dtype(dtype));
        if (grads[k].scalar_type() != dtype) grads[k] = grads[k].to(dtype);
      }
      at::_chunk_cat_out(input, grads, 0, ranks);
    }
    at::Tensor reduced = at::empty({row_numel}, options);
    // Both allocated on the compute stream, and let go once it has waited for the reduction.
    const comm_streams::scope reduce_scatter = streams.enter(comm_role::reduce_scatter);
    pending_collective work = comm.reduce_scatter(input.view(-1), reduced, reduce_op::mean);
    failpoint("step.backward");  // mid backward, with a reduce-scatter under way
    reduced_.insert(reduced_.end(), indices.begin(), indices.end());
    reductions_.push_back({std::move(indices), std::move(reduced), std::move(work), std::move(input), {}});
  }
}

const sharded_param* param_group::end_backward() {
  const std::vector<std::size_t> reduced = std::exchange(reduced_, {});
  for (std::size_t i : reduced) {
    if (params_[i].full().grad().defined()) return &params_[i];
  }
  return nullptr;
}

void param_group::start_replicate_all_reduce(collectives& replicate, const comm_streams& streams) {
  // After the reduce-scatter stream, which waited for the partial sums' last write when this
  // reduce-scatter was issued, and then for the reduce-scatter itself: not for the compute since.
  const comm_streams::scope replicas = streams.enter_after(comm_role::replicate, comm_role::reduce_scatter);
  for (std::size_t k = 0; k < reductions_.size(); ++k) {
    in_flight& reduction = reductions_[k];
    reduction.work.wait();
    if (k < partials_.size() && partials_[k].defined()) {
      reduction.read_elsewhere = std::exchange(partials_[k], {});
      reduction.buffer.add_(reduction.read_elsewhere);
    }
    reduction.work = replicate.all_reduce(reduction.buffer, reduce_op::mean);
  }
}

void param_group::release_reduce_scatter_inputs(const comm_streams& streams) {
  if (!holds_reduce_scatter_inputs()) return;
  streams.wait_for(comm_role::reduce_scatter);
  for (in_flight& reduction : reductions_) reduction.input.reset();
}

bool param_group::holds_reduce_scatter_inputs() const noexcept {
  return std::any_of(reductions_.begin(), reductions_.end(),
                     [](const in_flight& reduction) { return reduction.input.defined(); });
}

void param_group::keep_partial() {
  partials_.resize(std::max(partials_.size(), reductions_.size()));
  for (std::size_t k = 0; k < reductions_.size(); ++k) {
    in_flight& reduction = reductions_[k];
    reduction.work.wait();
    partials_[k] = partials_[k].defined() ? partials_[k].add_(reduction.buffer) : std::move(reduction.buffer);
  }
  reductions_.clear();
}

void param_group::finish_reduce_scatter() {
  for (in_flight& reduction : reductions_) {
    reduction.work.wait();  // the current stream waits, then what the replicate stream read may go
    std::int64_t offset = 0;
    for (std::size_t i : reduction.indices) {
      sharded_param& p = params_[i];
      p.accumulate_grad(reduction.buffer.narrow(0, offset, p.shard_numel()));
      offset += p.shard_numel();
    }
  }
  reductions_.clear();
}

void param_group::finish_reduce_scatter_to_host(const comm_streams& streams, std::vector<at::Tensor>& held) {
  // Waiting for nothing the compute stream issued: each reduction's wait orders it.
  const comm_streams::scope copy_out = streams.on(comm_role::reduce_scatter);
  for (in_flight& reduction : reductions_) {
    reduction.work.wait();
    std::int64_t offset = 0;
    for (std::size_t i : reduction.indices) {
      const sharded_param& p = params_[i];
      p.accumulate_grad(reduction.buffer.narrow(0, offset, p.shard_numel()));
      offset += p.shard_numel();
    }
    for (at::Tensor* kept : {&reduction.buffer, &reduction.input, &reduction.read_elsewhere}) {
      if (kept->defined()) held.push_back(std::move(*kept));
    }
  }
  reductions_.clear();
}

void param_group::settle_host_grads() {
  for (const sharded_param& p : params_) p.settle_grad();
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
    // Offloaded shards are gathered on the device too (NCCL takes device tensors).
    const at::Tensor packed = params_[indices.front()].offloaded() ? copied_in(indices) : packed_shards(indices);
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
  make(group_move::hold_masters);
  for (std::size_t i = 0; i < params_.size(); ++i) params_[i].hold_whole(masters[i]);
}

void param_group::request_rows(int rank, std::vector<nn::row_request>& requests) const {
  for (const sharded_param& p : params_) {
    if (auto request = p.rows_request(rank)) requests.push_back(std::move(*request));
  }
}

void param_group::come_to_rest() {
  make(group_move::come_to_rest);
  for (const sharded_param& p : params_) p.release_full();
}

void param_group::release_masters(int rank) {
  make(group_move::release_masters);
  for (const sharded_param& p : params_) p.release_whole(rank);
}

}  // namespace loom::sharding

#pragma once
// A unit's parameters, or the root's, under fsdp(): gathered and resharded together, their
// gradients reduce-scattered together (FSDP2's per-group part, with its collectives). Each
// collective carries one dtype's parameters packed rank-major, so a group issues one per dtype: a
// gather carries what the parameters compute in, a reduce-scatter the reduce dtype (mixed
// precision's; without it, the parameters' own).

#include <loom/runtime/collectives.hpp>
#include <loom/schedule/schedule.hpp>
#include <loom/strategies/fsdp/comm_streams.hpp>
#include <loom/strategies/fsdp/sharded_param.hpp>

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace loom::sharding {

// Where a group's full parameters are (FSDP2's ShardedState, with the one with_whole_module adds):
enum class group_state {
  unsharded,        // whole, with bytes: as built, and after a gather
  sharded,          // at rest between the group's passes: each rank holds its rows only
  holding_masters,  // inside with_whole_module: the module's parameters are the gathered masters
};

// What moves a group, and the states it may start from; a move from another is loom's bug, and fails
// naming the group, the move and the state. A gather is issued in either unsharded or sharded state,
// so that every rank issues the same collectives; on an unsharded group (a forward without backward,
// an evaluation) it writes the rows into the bytes it holds. Resharding a sharded group does nothing.
enum class group_move { gather, reshard, come_to_rest, hold_masters, release_masters };

[[nodiscard]] constexpr bool may_start(group_move move, group_state from) noexcept {
  switch (move) {
    case group_move::gather:
    case group_move::reshard:
    case group_move::come_to_rest:
    case group_move::hold_masters: return from != group_state::holding_masters;
    case group_move::release_masters: return from == group_state::holding_masters;
  }
  return false;
}

// Where a move leaves the group.
[[nodiscard]] constexpr group_state after(group_move move) noexcept {
  switch (move) {
    case group_move::gather: return group_state::unsharded;
    case group_move::hold_masters: return group_state::holding_masters;
    case group_move::reshard:
    case group_move::come_to_rest:
    case group_move::release_masters: return group_state::sharded;
  }
  return group_state::sharded;
}

class param_group {
 public:
  // `reduce`: what gradients are reduce-scattered in; none: each parameter's own dtype.
  explicit param_group(std::string name, std::optional<at::ScalarType> reduce = std::nullopt)
      : name_(std::move(name)), reduce_(reduce) {}

  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  [[nodiscard]] const std::vector<sharded_param>& params() const noexcept { return params_; }
  void add(sharded_param param) { params_.push_back(std::move(param)); }

  // The schedule entries of its all-gather (every parameter) and of its reduce-scatter (the
  // trainable ones), over the shard group `group`, one per dtype, in the order they are issued; and,
  // under hybrid sharding, of the all-reduce of the reduced shards over the replicate group `group`.
  [[nodiscard]] std::vector<schedule_entry> gather_entries(step_phase phase, const std::string& group) const;
  [[nodiscard]] std::vector<schedule_entry> reduce_scatter_entries(const std::string& group) const;
  [[nodiscard]] std::vector<schedule_entry> replicate_entries(const std::string& group) const;

  // Issues the all-gathers without waiting, so that they overlap other work: packed on the
  // copy-in stream, gathered on the gather stream.
  void start_gather(collectives& comm, const comm_streams& streams);
  // Waits for the issued all-gathers, if any, and writes every rank's rows into the full parameters.
  void finish_gather();
  [[nodiscard]] group_state state() const noexcept { return state_; }
  // Frees the full parameters' bytes.
  void reshard();

  // Issues the reduce-scatter of the trainable parameters' gradients (their mean over the group), packed
  // rank-major in one kernel on the current stream, reduced on the reduce-scatter stream, and drops
  // the full gradients. A parameter this rank produced no gradient for sends zeros: every rank issues
  // the same collective, and the parameter ends the backward with the mean (zero where no rank used it).
  void start_reduce_scatter(collectives& comm, const comm_streams& streams);
  // Ends this backward's reductions: a parameter whose gradient reached it after its reduce-scatter
  // began (which would be lost), if any, for the caller to fail the step naming it.
  [[nodiscard]] const sharded_param* end_backward();
  // Hybrid sharding: once the reduce-scatters are done (on the replicate stream, which waits for
  // them and for nothing the compute stream issued since; waited for on the CPU), each one's reduced
  // rows, with what keep_partial() kept of the micro-batches before, averaged across the replicate
  // group, issued without waiting. Over S ranks a shard and R replicas, the mean of means is the mean
  // over every rank.
  void start_replicate_all_reduce(collectives& replicate, const comm_streams& streams);
  // Hybrid sharding, as the next reduce-scatter is issued (FSDP2's reduce_scatter_state): the current
  // stream waits for the reduce-scatter stream, and only then are the inputs of this group's
  // reduce-scatters let go. Their all-reduce's wait orders the replicate stream, not the one that
  // allocated them, whose allocator would otherwise hand their bytes to the next unit's packing
  // while NCCL still reads them. So a backward holds one group's inputs at a time.
  void release_reduce_scatter_inputs(const comm_streams& streams);
  // Whether a reduce-scatter's input is held (issued, and neither waited for nor released).
  [[nodiscard]] bool holds_reduce_scatter_inputs() const noexcept;
  // Hybrid sharding, in a micro-batch that does not reach across replicas: waits for the reductions
  // issued and keeps their reduced rows aside, added up, for the all-reduce of the last micro-batch
  // (FSDP2's partial reduce output).
  void keep_partial();
  // Waits for the reductions issued (under NCCL the current stream waits, not the host), lets their
  // inputs go, and adds each parameter's reduced rows to its shard's gradient (its first, the reduced
  // rows' bytes when the dtypes agree: no copy, and not a view, sharded_param::accumulate_grad).
  void finish_reduce_scatter();
  // The same for offloaded shards (fsdp_options::offload): the reduce-scatter stream, not the compute
  // stream, waits for each reduction and copies its reduced rows into the shards' pinned host
  // gradients without blocking (FSDP2's copy out of the post-backward), so that the copy runs beside
  // the compute. The reductions' inputs and reduced rows, allocated on the compute stream and read by
  // those copies, go to `held`, for the caller to keep until the compute stream has waited for the
  // reduce-scatter stream. The host reads nothing until settle_host_grads().
  void finish_reduce_scatter_to_host(const comm_streams& streams, std::vector<at::Tensor>& held);
  // Offloaded, once the host has waited for the device's copies out: the gradients they carried join
  // the shards' (sharded_param::settle_grad).
  void settle_host_grads();
  // After a backward that accumulates unsharded (fsdp_options::accumulate_unsharded): the gradients
  // computed narrower than the reduce dtype are kept in it until the reduce-scatter
  // (sharded_param::stash_grad).
  void stash_grads();

  // Every parameter's master weights (the shards' dtype), gathered whole, in params() order.
  [[nodiscard]] std::vector<at::Tensor> gather_masters(collectives& comm) const;
  // Around a change to the whole parameters: the module's parameters hold the gathered masters, then
  // each shard takes its rows back and the group is at rest.
  void hold_masters(collectives& comm);
  void release_masters(int rank);
  // In setup: the requests for this rank's rows of each parameter, into its shard (for
  // strategy_context::initial_values to fill), then the group at rest.
  void request_rows(int rank, std::vector<nn::row_request>& requests) const;
  void come_to_rest();

 private:
  // Checks that `move` may start from the group's state (may_start), then records where it leaves it.
  void make(group_move move);
  // What a collective carries of params_[i]: a gather, the dtype it computes in; a reduction, the
  // reduce dtype.
  [[nodiscard]] at::ScalarType carried_dtype(std::size_t i, bool reduction) const;
  // Indices of params by the dtype their collective carries, in registration order; a reduction's
  // of the trainable ones only.
  [[nodiscard]] std::vector<std::vector<std::size_t>> batches(bool reduction) const;
  [[nodiscard]] std::vector<schedule_entry> entries(collective_op op, step_phase phase, bool reduction,
                                                    const std::string& group) const;
  // A gather's input on the device, in the shards' dtype: params_'s shards at `indices`, packed by one
  // cat; offloaded, by a copy in of each (from pinned memory, not blocking the host).
  [[nodiscard]] at::Tensor packed_shards(const std::vector<std::size_t>& indices) const;
  [[nodiscard]] at::Tensor copied_in(const std::vector<std::size_t>& indices) const;

  struct in_flight {
    std::vector<std::size_t> indices;
    at::Tensor buffer;        // a gather's N × packed shards; a reduction's reduced rows, in indices' order
    pending_collective work;  // a gather's; a reduce-scatter's, then its replicas' all-reduce
    // A reduce-scatter's packed input, allocated on the compute stream and read on the reduce-scatter
    // stream: kept until the compute stream has waited for that read.
    at::Tensor input;
    // What another stream reads until `work` is waited for (the partial sums added into `buffer` on
    // the replicate stream): kept, so that the compute stream's allocator does not hand out its bytes.
    at::Tensor read_elsewhere;
  };

  std::string name_;
  std::optional<at::ScalarType> reduce_;
  std::vector<sharded_param> params_;
  group_state state_ = group_state::unsharded;  // as built
  std::vector<in_flight> gathers_;
  std::vector<in_flight> reductions_;
  std::vector<std::size_t> reduced_;  // the parameters whose reduce-scatter this backward issued
  std::vector<at::Tensor> partials_;  // hybrid: keep_partial()'s sums, one a reduction, in batches(true) order
};

}  // namespace loom::sharding

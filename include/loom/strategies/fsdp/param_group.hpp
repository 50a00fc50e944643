#pragma once
// A unit's parameters, or the root's, under fsdp(): gathered and resharded together, their
// gradients reduce-scattered together (FSDP2's per-group part, with its collectives). Each
// collective carries one dtype's parameters packed rank-major, so a group issues one per dtype.

#include <loom/runtime/collectives.hpp>
#include <loom/schedule/schedule.hpp>
#include <loom/strategies/fsdp/flagged_gradients.hpp>
#include <loom/strategies/fsdp/sharded_param.hpp>

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <string>
#include <vector>

namespace loom::sharding {

class param_group {
 public:
  explicit param_group(std::string name) : name_(std::move(name)) {}

  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  [[nodiscard]] const std::vector<sharded_param>& params() const noexcept { return params_; }
  void add(sharded_param param) { params_.push_back(std::move(param)); }

  // The schedule entries of its all-gather (every parameter) and of its reduce-scatter (the
  // trainable ones), one per dtype, in the order they are issued.
  [[nodiscard]] std::vector<schedule_entry> gather_entries(step_phase phase) const;
  [[nodiscard]] std::vector<schedule_entry> reduce_scatter_entries() const;

  // The group's full parameters move between two states:
  //   whole    (as built, and after a gather)  -- reshard() frees their bytes -->  at rest
  //   at rest  (between its passes)            -- finish_gather() gives them bytes and writes them --> whole
  // A gather is issued in either state, so that every rank issues the same collectives; on a whole
  // group (a forward with no backward, an evaluation) it writes the rows into the bytes it holds.
  // Resharding a group at rest does nothing.

  // Issues the all-gathers without waiting, so that they overlap other work.
  void start_gather(collectives& comm);
  // Waits for the issued all-gathers, if any, and writes every rank's rows into the full parameters.
  void finish_gather();
  void gather_now(collectives& comm);
  [[nodiscard]] bool whole() const noexcept { return whole_; }
  // Frees the full parameters' bytes.
  void reshard();

  // Issues the reduce-scatter of the trainable parameters' gradients (SUM, divided by N) and drops
  // the full gradients, flagged (flagged_gradients): a parameter no rank used keeps no gradient.
  void start_reduce_scatter(collectives& comm);
  // A parameter whose gradient reached it after its reduce-scatter began (which would be lost), if
  // any: the caller fails the step, naming it.
  [[nodiscard]] const sharded_param* late_gradient() const;
  // Waits for it and adds each parameter's reduced rows to its shard's gradient (adding, as after
  // no_sync).
  void finish_reduce_scatter();

 private:
  // Indices of params by dtype, in registration order.
  [[nodiscard]] std::vector<std::vector<std::size_t>> batches(bool trainable_only) const;

  struct in_flight {
    std::vector<std::size_t> indices;
    at::Tensor buffer;  // a gather's N × packed shards; a reduce-scatter's output, its used-flags last
    pending_collective work;
    flagged_gradients layout;  // a reduce-scatter's
  };

  std::string name_;
  std::vector<sharded_param> params_;
  bool whole_ = true;  // until the first reshard
  std::vector<in_flight> gathers_;
  std::vector<in_flight> reductions_;
};

}  // namespace loom::sharding

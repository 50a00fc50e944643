#pragma once
// fsdp(options): parameters sharded on dim 0 across ranks at rest, gathered per unit for its forward
// and backward, gradients reduce-scattered, so that parameters, gradients and optimizer state take
// about 1/N per rank (PyTorch's FSDP2 layout, driven from C++ over c10d). LoRA adapters are not
// sharded but replicated: identical at creation, their gradients averaged after backward in one
// stable order (sorted by name), zero-filled where a rank produced none.
//
// A unit is a block held as loom::nn::Unit<B> (loom/nn/unit.hpp); everything outside any unit is the
// root, gathered for the whole step.

#include <loom/dsl/strategies.hpp>
#include <loom/strategies/engine.hpp>
#include <loom/strategies/strategy_context.hpp>

#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

namespace sharding {
class fsdp_state;
}

class fsdp_engine {
 public:
  static constexpr std::string_view name = "fsdp";
  static constexpr bool shards_parameters = true;
  // Each rank's shards are made from the deferred records of a model constructed without its bytes.
  static constexpr bool materialises_parameters = true;
  // Under mixed_precision(...), FSDP2's: the shards stay in their dtype (the master copy), the
  // gathers carry and compute in param, the gradients are reduced in reduce (docs/precision.md).
  static constexpr bool casts_parameters = true;

  explicit fsdp_engine(const fsdp_options& settings);
  // Moved, never copied: the units and the pre-backward hooks point at its state, on the heap.
  fsdp_engine(fsdp_engine&&) noexcept = default;
  fsdp_engine& operator=(fsdp_engine&&) noexcept = default;

  void setup(strategy_context& context);
  void before_forward(strategy_context& context);
  void after_backward(strategy_context& context);

  // This rank's shards of the trainable sharded parameters and the replicated adapters, in the
  // module's registration order.
  [[nodiscard]] std::vector<at::Tensor> optimizer_parameters(const strategy_context& context) const;
  // The global norm, on the device: shards' parts added across ranks, replicated adapters counted once.
  at::Tensor clip_grad_norm(strategy_context& context, double max_norm, double norm_type);
  // The schedule entries the step under way issued so far, by index, in the order of issue: every
  // communicator's collectives in one order, the same on every rank whatever the timing.
  [[nodiscard]] const std::vector<std::size_t>& issued_entries() const;
  // A forward that read a parameter at rest went around loom::nn::Unit: says which unit.
  void explain_forward_failure(strategy_context& context, std::exception_ptr error);
  // Gathers every parameter, runs `change`, and keeps this rank's rows of the result.
  void with_full_parameters(strategy_context& context, const std::function<void()>& change);
  // This rank's flat shards, the replicated adapters and the buffers, by name; and back, from a
  // local_state of the same layout (the same model over as many ranks).
  [[nodiscard]] tensor_state local_state(strategy_context& context) const;
  void load_local_state(strategy_context& context, const tensor_state& state);
  // For a checkpoint saved over another number of ranks: this rank's shard of the sharded parameter
  // `name` (or of a tensor laid out as it, an optimizer's moment), from the old ranks' shards.
  // Nothing when `name` is not sharded (an adapter, a buffer: whole on every rank).
  [[nodiscard]] std::optional<at::Tensor> reshard_local(strategy_context& context, const std::string& name,
                                                        const std::vector<at::Tensor>& shards) const;
  // The ranks one parameter is sharded across: the world, or under hybrid sharding a shard group.
  [[nodiscard]] int shard_group_size(const strategy_context& context) const;
  // Every parameter and buffer, whole (gathered); and back, resharded.
  [[nodiscard]] tensor_state full_state(strategy_context& context);
  void load_full_state(strategy_context& context, const tensor_state& state);

 private:
  // Notes for job.describe(): the units, their gathered sizes, the bytes at rest on this rank.
  void describe_layout(strategy_context& context) const;

  std::shared_ptr<sharding::fsdp_state> state_;  // shared_ptr: its deleter is made where it is complete
};

inline fsdp_engine make_engine(const fsdp_stage& stage) { return fsdp_engine(stage.settings()); }

}  // namespace loom

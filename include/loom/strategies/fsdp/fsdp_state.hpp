#pragma once
// fsdp()'s state across a step (FSDP2's per-module state): the ranks' mesh, the root's and the
// units' parameter groups, the replicated adapters, the step's collectives in the one order every
// rank issues them over every communicator, and the unit hooks that issue them around each unit's
// forward and backward (gathers prefetched one unit ahead, reduce-scatters as each unit's backward
// completes; under hybrid sharding, each reduce-scatter's all-reduce across the replicas just before
// the next reduce-scatter, ordered after its own on the device), each kind on its own stream on a GPU.
// A model with branches (loom/nn/branch.hpp) has each branch's units, and its parameters outside
// them (the branch's root), in collectives of that branch, which a pass issues when it takes it.

#include <loom/dsl/strategies.hpp>
#include <loom/nn/branch.hpp>
#include <loom/nn/unit.hpp>
#include <loom/runtime/mesh.hpp>
#include <loom/schedule/cursor.hpp>
#include <loom/strategies/fsdp/param_group.hpp>
#include <loom/strategies/fsdp/replicated_adapters.hpp>
#include <loom/strategies/strategy_context.hpp>

#include <cstddef>
#include <optional>
#include <vector>

namespace loom::sharding {

class fsdp_state : public nn::unit_hooks, public nn::branch_hooks {
 public:
  explicit fsdp_state(const fsdp_options& settings) : settings_(settings) {}
  ~fsdp_state() override;
  fsdp_state(const fsdp_state&) = delete;
  fsdp_state& operator=(const fsdp_state&) = delete;

  // Makes the mesh of settings().shard_group_size (agreed by every rank), finds the units and
  // attaches their hooks, shards every parameter but the adapters into its group, and declares the
  // step's collectives in the schedule. Once, in the engine's setup.
  void shard(strategy_context& context);

  [[nodiscard]] const fsdp_options& settings() const noexcept { return settings_; }
  [[nodiscard]] const rank_mesh& mesh() const { return *mesh_; }
  // The shard group's collectives: the gathers, the reduce-scatters, the norm of the shards.
  [[nodiscard]] collectives& comm() const { return mesh_->shard(); }
  // Whether shard groups replicate each other (hybrid sharding).
  [[nodiscard]] bool hybrid() const { return mesh_->replicate_size() > 1; }
  [[nodiscard]] const replicated_adapters& adapters() const noexcept { return adapters_; }
  // The shards and the adapters, in the module's registration order: what the optimizer steps.
  [[nodiscard]] const std::vector<at::Tensor>& optimizer_order() const noexcept { return optimizer_order_; }
  [[nodiscard]] const param_group& root() const noexcept { return root_; }
  [[nodiscard]] const std::vector<param_group>& units() const noexcept { return units_; }

  // The root, the branches' roots, then the units in registration order.
  template <class F>
  void for_each_group(F&& each) {
    each(root_);
    for (param_group& branch_root : branch_roots_) each(branch_root);
    for (param_group& unit : units_) each(unit);
  }
  template <class F>
  void for_each_group(F&& each) const {
    each(root_);
    for (const param_group& branch_root : branch_roots_) each(branch_root);
    for (const param_group& unit : units_) each(unit);
  }

  // The step: the root gathered before the forward; after the backward, everything not yet issued
  // issued, the groups resharded and the reductions the pass synchronises finished.
  void begin_step();
  void end_backward();
  // How far this pass synchronises: everything but under job.no_sync(), where the gradients are
  // reduce-scattered but not all-reduced across replicas, or, with accumulate_unsharded, kept whole.
  [[nodiscard]] gradient_sync pass_sync() const noexcept;
  // The schedule entries this step issued so far, by index, in the order they were issued.
  [[nodiscard]] const std::vector<std::size_t>& issued_entries() const noexcept { return cursor_.issued_entries(); }
  // The unit whose forward the step expects next, if any (for the messages).
  [[nodiscard]] const param_group* next_unit() const noexcept {
    return next_unit_ < units_.size() ? &units_[next_unit_] : nullptr;
  }

  // In a model with branches, before the pass takes one: the branches' parameters are all at rest.
  [[nodiscard]] bool awaits_branch() const noexcept {
    return !branches_.empty() && cursor_.taken_branch() == schedule_cursor::every_branch;
  }
  [[nodiscard]] const std::vector<nn::branch_module>& branches() const noexcept { return branches_; }

  // Around a change to the whole model, or a call of it outside a step (job.with_whole_module): every
  // group holds its master weights gathered, and the unit hooks stand aside; then each rank takes
  // its rows back and the groups are at rest.
  void hold_masters();
  void release_masters();

  void before_forward(std::size_t unit) override;
  void after_forward(std::size_t unit, const std::vector<at::Tensor>& outputs) override;
  // The pass takes a branch: every rank checks that every rank took the same one, and the branch's
  // root and first unit are gathered.
  void enter_branch(std::size_t branch) override;

 private:
  // A unit's collectives in the step: indices into the cursor.
  struct unit_collectives {
    static constexpr std::size_t none = static_cast<std::size_t>(-1);
    std::size_t forward_gather = none;
    std::size_t backward_gather = none;  // none when the unit stays whole into its backward
    std::size_t reduce_scatter = none;
  };

  // The units a pass runs as a chain: a branch's, or every unit of a model without branches.
  struct unit_chain {
    std::size_t first = 0;
    std::size_t end = 0;
    std::size_t branch = schedule_cursor::every_branch;
  };

  // Finds the branches, attaches their hooks and the chains of units they hold.
  void find_chains(strategy_context& context, const std::vector<nn::unit_module>& units);
  [[nodiscard]] const unit_chain& chain_of(std::size_t unit) const { return chains_[unit_chain_[unit]]; }
  void declare_collectives(collective_schedule& schedule);
  // Gathers every rank's branch of this pass (on the host) and fails unless they agree.
  void check_branch_taken() const;
  void issue_through(std::size_t collective);
  void retire_reduce_scatter(param_group& group);
  // Waits for a group's reductions and adds them into its shards' gradients (offloaded: copies them
  // out to the host, param_group::finish_reduce_scatter_to_host).
  void finish_reduce_scatter(param_group& group);
  // Offloaded: the compute stream waits for the reduce-scatter stream's copies out, and what they
  // read may go.
  void release_copied_out();
  // The gradient of the unit's output is complete: its successor's backward is done.
  void before_backward(std::size_t unit);
  [[noreturn]] void fail_out_of_order(std::size_t unit) const;

  fsdp_options settings_;
  strategy_context* context_ = nullptr;
  std::optional<rank_mesh> mesh_;
  comm_streams streams_;        // none on the CPU
  param_group root_{"(root)"};  // with the policy's reduce dtype, once shard() knows it
  std::vector<param_group> units_;
  std::vector<nn::unit_base*> unit_modules_;
  std::vector<nn::branch_module> branches_;
  std::vector<param_group> branch_roots_;  // each branch's parameters outside its units
  std::vector<unit_chain> chains_;         // one a branch; one in all without branches
  std::vector<std::size_t> unit_chain_;    // each unit's, an index into chains_
  replicated_adapters adapters_;
  std::vector<at::Tensor> optimizer_order_;
  schedule_cursor cursor_;
  std::size_t root_gather_ = unit_collectives::none;
  std::size_t branch_check_ = unit_collectives::none;  // with branches: every rank's branch, gathered
  std::vector<std::size_t> branch_root_gathers_;
  std::vector<unit_collectives> unit_steps_;
  std::vector<at::Tensor> copied_out_;   // offloaded: what the copies out of the last group read
  param_group* last_reduced_ = nullptr;  // the group whose reduce-scatter this step issued last
  std::size_t next_unit_ = 0;            // the unit whose forward comes next in this step
  bool holding_masters_ = false;         // between hold_masters() and release_masters()
};

}  // namespace loom::sharding

#include <loom/strategies/fsdp/fsdp_state.hpp>

#include <loom/base/text.hpp>
#include <loom/runtime/host_reads.hpp>
#include <loom/strategies/fsdp/init_checks.hpp>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

namespace loom::sharding {
namespace {

constexpr std::int64_t mib = 1024 * 1024;

}  // namespace

fsdp_state::~fsdp_state() {
  for (nn::unit_base* unit : unit_modules_) unit->detach();
  for (const nn::branch_module& branch : branches_) branch.module->detach();
}

void fsdp_state::shard(strategy_context& context) {
  context_ = &context;
  const runtime& rt = context.rt();
  const std::int64_t asked = settings_.shard_group_size;
  const std::int64_t shard_size = asked == fsdp_options::every_rank ? rt.world_size()
                                  : asked == fsdp_options::per_node ? rt.env().local_world_size
                                                                    : asked;
  constexpr std::int64_t int_min = std::numeric_limits<int>::min();
  constexpr std::int64_t int_max = std::numeric_limits<int>::max();
  mesh_.emplace(rt, static_cast<int>(std::clamp(shard_size, int_min, int_max)));
  streams_ = comm_streams(rt.device());
  const std::optional<precision_policy>& precision = context.precision();
  const std::optional<at::ScalarType> reduce = precision ? std::optional(precision->reduce) : std::nullopt;
  root_ = param_group("(root)", reduce);
  const std::vector<unit_module> found = find_units(context.module());
  for (const unit_module& unit : found) {
    unit.module->attach(this, units_.size());
    unit_modules_.push_back(unit.module);
    units_.emplace_back(unit.name, reduce);
  }
  find_chains(context, found);
  for (const nn::branch_module& branch : branches_) branch_roots_.emplace_back(branch.name + " (root)", reduce);
  std::vector<named_tensor> adapters;
  for (placed_parameter& p : place_parameters(context.module(), found)) {
    if (p.replicated) {
      optimizer_order_.push_back(p.tensor);
      adapters.push_back({std::move(p.name), std::move(p.tensor)});
      continue;
    }
    const std::size_t branch = nn::branch_of(branches_, p.name);
    param_group& group = p.group != root_group       ? units_[p.group - 1]
                         : branch < branches_.size() ? branch_roots_[branch]
                                                     : root_;
    const std::optional<at::ScalarType> compute =
        precision ? std::optional(precision->compute_dtype(p.tensor.scalar_type())) : std::nullopt;
    group.add(sharded_param(std::move(p.name), std::move(p.tensor), mesh_->shard_size(), compute, settings_.offload));
    if (group.params().back().trainable()) optimizer_order_.push_back(group.params().back().shard());
  }
  // This rank's rows of each sharded parameter, the adapters and buffers whole: never a whole
  // sharded parameter, from a checkpoint or a construction without the full replica.
  std::vector<nn::row_request> rows;
  for_each_group([&](const param_group& group) { group.request_rows(mesh_->shard_rank(), rows); });
  std::vector<named_tensor> whole = adapters;
  for (const auto& buffer : context.module().named_buffers()) whole.push_back({buffer.key(), buffer.value()});
  context.initial_values().fill(rows, whole);
  for_each_group([](param_group& group) { group.come_to_rest(); });
  adapters_ = replicated_adapters(std::move(adapters), static_cast<std::int64_t>(settings_.bucket_cap_mb) * mib, reduce,
                                  branches_);
  declare_collectives(context.schedule());
}

void fsdp_state::find_chains(strategy_context& context, const std::vector<unit_module>& units) {
  branches_ = nn::find_branches(context.module());
  if (branches_.empty()) {
    chains_.push_back({0, units.size()});
    unit_chain_.assign(units.size(), 0);
    return;
  }
  for (std::size_t b = 0; b < branches_.size(); ++b) {
    branches_[b].module->attach(this, b);
    chains_.push_back({0, 0, b});
  }
  for (std::size_t u = 0; u < units.size(); ++u) {
    const std::size_t branch = nn::branch_of(branches_, units[u].name);
    if (branch == branches_.size()) {
      throw_error<std::invalid_argument>(
          "fsdp(): unit '{}' is outside the model's branches ('{}' and the rest): in a model with branches fsdp() "
          "chains the units of each branch, and a pass runs one branch's; hold the unit inside a branch, or make "
          "it a plain module (its parameters then go with the root's)",
          units[u].name, branches_.front().name);
    }
    // Registration order lists a branch's units together, as they are its submodules.
    unit_chain& chain = chains_[branch];
    if (chain.end == chain.first) chain.first = u;
    chain.end = u + 1;
    unit_chain_.push_back(branch);
  }
}

gradient_sync fsdp_state::pass_sync() const noexcept {
  if (context_->sync_gradients()) return gradient_sync::replicas;
  return settings_.accumulate_unsharded ? gradient_sync::none : gradient_sync::shards;
}

void fsdp_state::issue_through(std::size_t collective) {
  if (collective != unit_collectives::none) cursor_.issue_through(collective, pass_sync());
}

// The collectives of a step, declared in the one order every rank issues them, over every
// communicator; the schedule gets their entries in that order. Forward: the root's gather, then each
// unit's (the first issued with the root's, each next one prefetched during a unit's forward).
// Backward, as each unit's output gradient is complete (its successor's backward done): the
// successor's reduce-scatter, then the gather of the unit before it (prefetched; the last unit stays
// whole from its forward). After backward: the first unit's and the root's reduce-scatters, and the
// adapters' all-reduces over every rank. Under hybrid sharding each reduce-scatter's all-reduce
// across the replicas comes just before the next reduce-scatter, a unit's backward later, so that
// the two communicators' collectives interleave alike on every rank whatever the timing (NCCL can
// deadlock when they do not); the last two reduce-scatters' come after both.
void fsdp_state::declare_collectives(collective_schedule& schedule) {
  constexpr std::size_t every_branch = schedule_cursor::every_branch;
  const std::string shard_group = mesh_->shard_role();
  const auto in_branch = [this](std::vector<schedule_entry> entries, std::size_t branch) {
    if (branch != every_branch) {
      for (schedule_entry& entry : entries) entry.branch = branches_[branch].name;
    }
    return entries;
  };
  const auto gather = [&](param_group& group, step_phase phase, std::size_t branch) {
    return cursor_.declare(
        schedule, in_branch(group.gather_entries(phase, shard_group), branch),
        [this, &group] { group.start_gather(comm(), streams_); }, gradient_sync::none, branch);
  };
  struct awaiting {
    param_group* group;
    std::size_t branch;
  };
  std::vector<awaiting> awaiting_replicas;  // reduce-scatters whose all-reduce is not declared yet
  const auto replicate = [&] {
    for (const auto [group, branch] : awaiting_replicas) {
      cursor_.declare(
          schedule, in_branch(group->replicate_entries(mesh_->replicate_role()), branch),
          [this, group] { group->start_replicate_all_reduce(mesh_->replicate(), streams_); }, gradient_sync::replicas,
          branch);
    }
    awaiting_replicas.clear();
  };
  const auto reduce_scatter = [&](param_group& group, std::size_t branch, bool after_replicas) {
    if (after_replicas) replicate();
    const std::size_t index = cursor_.declare(
        schedule, in_branch(group.reduce_scatter_entries(shard_group), branch),
        [this, &group] {
          if (last_reduced_ != nullptr) {
            retire_reduce_scatter(*last_reduced_);
            // Every group before it was retired so as well: one group's inputs in flight.
            TORCH_INTERNAL_ASSERT(!last_reduced_->holds_reduce_scatter_inputs(),
                                  "fsdp(): a second reduce-scatter's input would be in flight");
          }
          group.start_reduce_scatter(comm(), streams_);
          last_reduced_ = &group;
        },
        gradient_sync::shards, branch);
    if (hybrid()) awaiting_replicas.push_back({&group, branch});
    return index;
  };
  unit_steps_.assign(units_.size(), {});
  root_gather_ = gather(root_, step_phase::forward, every_branch);
  if (!branches_.empty()) {
    schedule_entry taken{collective_op::all_gather, step_phase::forward, {{"(branch taken)", {1}, at::kLong}}, "world"};
    branch_check_ = cursor_.declare(
        schedule, {std::move(taken)}, [this] { check_branch_taken(); }, gradient_sync::none);
  }
  branch_root_gathers_.assign(branches_.size(), unit_collectives::none);
  for (const unit_chain& chain : chains_) {
    if (chain.branch != every_branch) {
      branch_root_gathers_[chain.branch] = gather(branch_roots_[chain.branch], step_phase::forward, chain.branch);
    }
    for (std::size_t u = chain.first; u < chain.end; ++u) {
      unit_steps_[u].forward_gather = gather(units_[u], step_phase::forward, chain.branch);
    }
  }
  for (auto chain = chains_.rbegin(); chain != chains_.rend(); ++chain) {
    const std::size_t branch = chain->branch;
    for (std::size_t u = chain->end; u-- > chain->first;) {
      if (u + 1 < chain->end) unit_steps_[u + 1].reduce_scatter = reduce_scatter(units_[u + 1], branch, true);
      if (settings_.reshard_after_forward && u > chain->first) {
        unit_steps_[u - 1].backward_gather = gather(units_[u - 1], step_phase::backward, branch);
      }
    }
    if (chain->end > chain->first) {
      unit_steps_[chain->first].reduce_scatter = reduce_scatter(units_[chain->first], branch, true);
    }
    if (branch != every_branch) {
      reduce_scatter(branch_roots_[branch], branch, chain->end == chain->first);
      replicate();
    }
  }
  reduce_scatter(root_, every_branch, units_.empty());
  replicate();
  for (std::size_t b = 0; b < adapters_.bucket_count(); ++b) {
    const std::size_t branch =
        adapters_.bucket_branch(b) < branches_.size() ? adapters_.bucket_branch(b) : every_branch;
    cursor_.declare(
        schedule, {adapters_.bucket_entry(b)}, [this, b] { adapters_.start_all_reduce(b, context_->rt().comm()); },
        gradient_sync::replicas, branch);
  }
}

// Every rank's branch of the pass (the branches' count for none), gathered on the host: a rank that
// took another branch would issue collectives of the same shapes over other tensors, which no
// transport would notice.
void fsdp_state::check_branch_taken() const {
  const runtime& rt = context_->rt();
  const std::size_t taken = cursor_.taken_branch();
  const auto mine = static_cast<std::int64_t>(taken == schedule_cursor::every_branch ? branches_.size() : taken);
  const at::Tensor own = at::full({1}, mine, at::kLong);
  at::Tensor all = at::empty({rt.world_size()}, at::kLong);
  rt.host_comm().all_gather(own, all).wait();
  const std::int64_t* each = all.const_data_ptr<std::int64_t>();
  if (std::all_of(each, each + rt.world_size(), [&](std::int64_t b) { return b == mine; })) return;
  std::vector<std::string> choices;
  for (int r = 0; r < rt.world_size(); ++r) {
    const auto b = static_cast<std::size_t>(each[r]);
    choices.push_back(fmt::format("rank {} {}", r, b < branches_.size() ? "'" + branches_[b].name + "'" : "none"));
  }
  context_->fail(fmt::format(
      "fsdp(): the ranks took different branches of the model in this pass ({}): every rank must take the same "
      "branch in a pass, or they would exchange one branch's parameters for another's; choose it from what every "
      "rank shares, such as the step (loom::flow_matching::expert_for_step), not from a rank's own data",
      fmt::join(choices, ", ")));
}

// One reduce-scatter in flight at a time, as FSDP2 has it: as the next is issued, the one before is
// waited on (under NCCL the device waits and the host goes on), its input goes and its result joins
// the shards' gradients (under hybrid sharding's micro-batches, the partial sums), so that a backward
// holds one unit's packed gradients and no second copy of the shards'. When its all-reduce across the
// replicas is under way (declared before this reduce-scatter, and waited for at the backward's end),
// only its input goes, once the compute stream has waited for the reduce-scatter.
void fsdp_state::retire_reduce_scatter(param_group& group) {
  if (!hybrid()) {
    finish_reduce_scatter(group);
  } else if (pass_sync() == gradient_sync::shards) {
    group.keep_partial();
  } else {
    group.release_reduce_scatter_inputs(streams_);
  }
}

// Offloaded, the reduce-scatter stream copies the reduced rows out, and what those copies read is held
// until the compute stream has waited for them: the group before's at the next group's finish, a
// unit's backward later, by when they are done, so that the compute stream rarely waits on a copy.
void fsdp_state::finish_reduce_scatter(param_group& group) {
  if (!settings_.offload) {
    group.finish_reduce_scatter();
    return;
  }
  release_copied_out();
  group.finish_reduce_scatter_to_host(streams_, copied_out_);
}

void fsdp_state::release_copied_out() {
  if (copied_out_.empty()) return;
  streams_.wait_for(comm_role::reduce_scatter);
  copied_out_.clear();
}

void fsdp_state::begin_step() {
  cursor_.begin_step();
  last_reduced_ = nullptr;
  next_unit_ = 0;
  // The first unit's gather goes out with the root's: nothing else precedes it to hide it behind.
  // With branches it waits for the branch the pass takes.
  issue_through(units_.empty() || !branches_.empty() ? root_gather_ : unit_steps_.front().forward_gather);
  root_.finish_gather();
}

void fsdp_state::enter_branch(std::size_t branch) {
  if (holding_masters_) return;
  if (const std::size_t taken = cursor_.taken_branch(); taken != schedule_cursor::every_branch) {
    context_->fail(fmt::format(
        "fsdp(): the pass entered branch '{}' after branch '{}': a pass takes at most one branch of the model, "
        "the same on every rank, and issues its collectives alone; run each branch in a pass of its own (a forward "
        "and its backward)",
        branches_[branch].name, branches_[taken].name));
  }
  cursor_.take_branch(branch);
  const unit_chain& chain = chains_[branch];
  next_unit_ = chain.first;
  // Through the check that every rank took it, then the branch's root and its first unit.
  issue_through(chain.end > chain.first ? unit_steps_[chain.first].forward_gather : branch_root_gathers_[branch]);
  branch_roots_[branch].finish_gather();
}

void fsdp_state::end_backward() {
  const std::size_t taken = cursor_.taken_branch();
  const std::size_t chain_end = taken != schedule_cursor::every_branch ? chains_[taken].end
                                : branches_.empty()                    ? units_.size()
                                                                       : next_unit_;
  if (next_unit_ != chain_end) {
    context_->fail(fmt::format(
        "fsdp(): unit '{}' was not entered through loom::nn::Unit in this step: call its forward through the "
        "Unit type (blocks[i]->as<loom::nn::Unit<Block>>()->forward(x)), not the inner block's",
        units_[next_unit_].name()));
  }
  const gradient_sync sync = pass_sync();
  // What the units' hooks did not issue (a unit whose output needed no gradient on this rank).
  cursor_.issue_rest(sync);
  for (param_group& unit : units_) {
    unit.finish_gather();
    unit.reshard();
  }
  for (param_group& branch_root : branch_roots_) branch_root.reshard();
  root_.reshard();
  if (sync == gradient_sync::none) {
    for_each_group([](param_group& group) { group.stash_grads(); });
    return;
  }
  for_each_group([this](param_group& group) {
    // A gradient after the reduce-scatter began would be lost: never silently.
    if (const sharded_param* late = group.end_backward()) {
      context_->fail(fmt::format(
          "fsdp(): '{}' received a gradient after {}'s reduce-scatter began. fsdp() reduces a unit's gradients "
          "once the gradient of the previous unit's output is complete, which holds when the units form a chain "
          "(each unit's output feeds the next, as a transformer's blocks do); hold units whose backward passes "
          "interleave as one unit",
          late->name(), group.name()));
    }
  });
  if (sync == gradient_sync::shards && hybrid()) {
    // The replicas' all-reduce waits for the last micro-batch, with these rows added in.
    for_each_group([](param_group& group) { group.keep_partial(); });
    return;
  }
  for (std::size_t u = units_.size(); u-- > 0;) finish_reduce_scatter(units_[u]);
  for (std::size_t b = branch_roots_.size(); b-- > 0;) finish_reduce_scatter(branch_roots_[b]);
  finish_reduce_scatter(root_);
  if (sync == gradient_sync::replicas) adapters_.finish_all_reduces();
  if (settings_.offload) {
    // The optimizer steps the shards on the host: it waits for their gradients' copies out, as
    // FSDP2's end of backward does, the one read of the device a backward makes offloaded.
    streams_.wait_for(comm_role::reduce_scatter);
    wait_for_device(context_->rt().progress(), context_->rt().device());
    copied_out_.clear();
    for_each_group([](param_group& group) { group.settle_host_grads(); });
  }
}

void fsdp_state::hold_masters() {
  for_each_group([this](param_group& group) { group.hold_masters(comm()); });
  holding_masters_ = true;
}

void fsdp_state::release_masters() {
  holding_masters_ = false;
  const int rank = mesh_->shard_rank();
  for_each_group([rank](param_group& group) { group.release_masters(rank); });
}

void fsdp_state::before_forward(std::size_t unit) {
  if (holding_masters_) return;  // whole already, and outside a step
  if (const unit_chain& chain = chain_of(unit); chain.branch != cursor_.taken_branch()) {
    const std::size_t taken = cursor_.taken_branch();
    context_->fail(fmt::format(
        "fsdp(): unit '{}' of branch '{}' ran its forward {}; call the branch through its loom::nn::Branch type, "
        "whose forward tells every rank's schedule which branch the pass takes",
        units_[unit].name(), branches_[chain.branch].name,
        taken == schedule_cursor::every_branch
            ? std::string("outside it")
            : fmt::format("in a pass that took branch '{}'", branches_[taken].name)));
  }
  if (unit != next_unit_) fail_out_of_order(unit);
  ++next_unit_;
  issue_through(unit_steps_[unit].forward_gather);
  units_[unit].finish_gather();
  if (unit + 1 < chain_of(unit).end) issue_through(unit_steps_[unit + 1].forward_gather);
}

void fsdp_state::fail_out_of_order(std::size_t unit) const {
  const std::string expected = next_unit_ < chain_of(unit).end
                                   ? fmt::format("unit '{}' next, {}", units_[next_unit_].name(),
                                                 cursor_.describe(unit_steps_[next_unit_].forward_gather))
                                   : std::string("no more units in this step");
  context_->fail(fmt::format(
      "fsdp(): unit '{}' ran its forward where the schedule has {}; this rank would have waited on {} instead. "
      "Every rank must run every unit, in the order the model registers them, once a step (a unit that a rank "
      "skips would leave the others waiting in its all-gather)",
      units_[unit].name(), expected, cursor_.describe(unit_steps_[unit].forward_gather)));
}

void fsdp_state::after_forward(std::size_t unit, const std::vector<at::Tensor>& outputs) {
  if (holding_masters_) return;
  const bool backward_follows =
      at::GradMode::is_enabled() &&
      std::any_of(outputs.begin(), outputs.end(), [](const at::Tensor& t) { return t.defined() && t.requires_grad(); });
  for (const at::Tensor& output : outputs) {
    if (!backward_follows || !output.defined() || !output.requires_grad()) continue;
    at::Tensor(output).register_hook([this, unit](const at::Tensor&) { before_backward(unit); });
  }
  if (!settings_.reshard_after_forward) return;
  if (outputs.empty() && at::GradMode::is_enabled()) return;  // nothing to hang a pre-backward gather on
  // The last unit's backward comes first: FSDP2 keeps it whole rather than gather it again.
  if (backward_follows && unit + 1 == chain_of(unit).end) return;
  units_[unit].reshard();
}

void fsdp_state::before_backward(std::size_t unit) {
  const unit_chain& chain = chain_of(unit);
  if (unit + 1 < chain.end) {
    // The unit after this one is done with its backward: its gradients go, and its parameters'
    // bytes (FSDP2's reshard after backward), so that a backward holds one or two units whole.
    issue_through(unit_steps_[unit + 1].reduce_scatter);
    units_[unit + 1].reshard();
  }
  if (unit > chain.first) issue_through(unit_steps_[unit - 1].backward_gather);
  issue_through(unit_steps_[unit].backward_gather);
  units_[unit].finish_gather();
}

}  // namespace loom::sharding

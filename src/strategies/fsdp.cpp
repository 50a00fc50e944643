#include <loom/strategies/fsdp.hpp>

#include <loom/base/text.hpp>
#include <loom/nn/at_rest.hpp>
#include <loom/runtime/host_reads.hpp>
#include <loom/strategies/fsdp/fsdp_state.hpp>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <unordered_map>

namespace loom {
namespace {

using sharding::param_group;
using sharding::sharded_param;

constexpr std::int64_t mib = 1024 * 1024;

}  // namespace

fsdp_engine::fsdp_engine(const fsdp_options& settings) : state_(std::make_shared<sharding::fsdp_state>(settings)) {}

void fsdp_engine::setup(strategy_context& context) {
  if (state_->settings().offload && context.rt().device().is_cpu()) {
    throw_error<std::invalid_argument>(
        "fsdp(offload=true) moves the shards, their gradients and the optimizer's state to host memory, and this "
        "job's device is the CPU already: leave offload out (or run on a GPU)");
  }
  context.require_process_group(name);
  state_->shard(context);
  describe_layout(context);
}

void fsdp_engine::describe_layout(strategy_context& context) const {
  const sharding::fsdp_state& s = *state_;
  const auto bytes = [](const at::Tensor& t) { return static_cast<std::int64_t>(t.nbytes()); };
  std::int64_t at_rest = 0;
  std::vector<std::string> gathered;
  s.for_each_group([&](const param_group& group) {
    std::int64_t full = 0;
    for (const sharded_param& p : group.params()) {
      at_rest += bytes(p.shard());
      full += bytes(p.full());
    }
    if (&group != &s.root()) gathered.push_back(fmt::format("{:.2f}", static_cast<double>(full) / mib));
  });
  for (const named_tensor& a : s.adapters().tensors()) at_rest += bytes(a.tensor);
  if (s.units().empty()) {
    std::vector<std::string> candidates;
    for (const auto& item : context.module().named_children()) {
      const std::string kind = item.value()->name();
      if (kind == "torch::nn::ModuleListImpl" || kind == "torch::nn::SequentialImpl") candidates.push_back(item.key());
    }
    context.note(fmt::format("fsdp: no unit: the whole model is the root, gathered for the whole step{}",
                             candidates.empty() ? std::string()
                                                : fmt::format("; the children of {} could be units (hold them as "
                                                              "loom::nn::Unit<...>)",
                                                              fmt::join(candidates, ", "))));
  } else {
    context.note(fmt::format("fsdp: {} and the root over {}, MiB gathered each: [{}]",
                             counted(static_cast<std::int64_t>(s.units().size()), "unit"),
                             counted(s.mesh().shard_size(), "rank"), fmt::join(gathered, ", ")));
  }
  if (s.hybrid()) {
    const std::vector<int> members = s.mesh().shard_ranks();
    context.note(
        fmt::format("fsdp: hybrid sharding: {} of {} each, replicating each other; this rank is in {} "
                    "(ranks {}-{}) and {}",
                    counted(s.mesh().replicate_size(), "shard group"), counted(s.mesh().shard_size(), "rank"),
                    s.mesh().shard_group(), members.front(), members.back(), s.mesh().replicate_group()));
  }
  context.note(fmt::format("fsdp: {:.2f} MiB of parameters at rest on this rank ({} replicated)",
                           static_cast<double>(at_rest) / mib,
                           counted(static_cast<std::int64_t>(s.adapters().tensors().size()), "adapter tensor")));
  if (s.settings().offload) {
    context.note(
        "fsdp: offload: the shards, their gradients and the optimizer's state in pinned host memory, each "
        "unit's shards copied to the device for its gather, the optimizer stepping on the host");
  }
}

void fsdp_engine::before_forward(strategy_context&) { state_->begin_step(); }

const std::vector<std::size_t>& fsdp_engine::issued_entries() const { return state_->issued_entries(); }

void fsdp_engine::after_backward(strategy_context&) { state_->end_backward(); }

std::vector<at::Tensor> fsdp_engine::optimizer_parameters(const strategy_context&) const {
  return state_->optimizer_order();
}

at::Tensor fsdp_engine::clip_grad_norm(strategy_context& context, double max_norm, double norm_type) {
  const bool infinity = std::isinf(norm_type) && norm_type > 0;
  // Shards add up across a shard group (its replicas hold the same ones); the replicated adapters,
  // identical on every rank, count once. All of it on the device: the host reads nothing.
  const c10::Device device = context.rt().device();
  std::vector<named_tensor> shards;
  state_->for_each_group([&](const param_group& group) {
    for (const sharded_param& p : group.params()) shards.push_back({p.name(), p.shard()});
  });
  // Offloaded, the shards' gradients are on the host, and so is their part of the norm; its sum
  // across the group runs on the device, as NCCL takes device tensors.
  const bool offload = state_->settings().offload;
  at::Tensor sharded = hooks::grad_norm_part(context, shards, norm_type, offload ? c10::Device(at::kCPU) : device);
  if (offload) sharded = to_device(sharded, device, sharded.scalar_type());
  sharded = sharded.reshape({1});
  collectives& shard_group = state_->comm();
  if (infinity) {
    at::Tensor all = at::empty({shard_group.world_size()}, sharded.options());
    shard_group.all_gather(sharded, all).wait();
    sharded = all.max();
  } else {
    shard_group.all_reduce(sharded, reduce_op::sum).wait();
    sharded = sharded.reshape({});
  }
  std::vector<at::Tensor> adapters;
  for (const named_tensor& a : state_->adapters().tensors()) adapters.push_back(a.tensor);
  const at::Tensor replicated = hooks::grad_norm_part(context, state_->adapters().tensors(), norm_type, device);
  at::Tensor part = infinity ? at::maximum(sharded, replicated) : sharded + replicated;
  hooks::add_up_over_tensor_group(context, part, norm_type);
  const at::Tensor norm = hooks::grad_norm_of(part, norm_type);
  if (!offload) {
    hooks::scale_grads_to(optimizer_parameters(context), max_norm, norm);
    return norm;
  }
  // The adapters' gradients scaled on the device, the shards' on the host, by the norm read there
  // (the host reads the device anyway before it steps the shards).
  hooks::scale_grads_to(adapters, max_norm, norm);
  std::vector<at::Tensor> shard_tensors;
  for (const named_tensor& shard : shards) shard_tensors.push_back(shard.tensor);
  hooks::scale_grads_to(shard_tensors, max_norm, read_on_host(context.rt().progress(), norm));
  return norm;
}

tensor_state fsdp_engine::local_state(strategy_context& context) const {
  tensor_state local;
  state_->for_each_group([&](const param_group& group) {
    for (const sharded_param& p : group.params()) local.push_back({p.name(), p.shard()});
  });
  for (const named_tensor& a : state_->adapters().tensors()) local.push_back(a);
  for (const auto& item : context.module().named_buffers()) local.push_back({item.key(), item.value()});
  return local;
}

void fsdp_engine::load_local_state(strategy_context& context, const tensor_state& state) {
  const tensor_state mine = local_state(context);
  std::unordered_map<std::string, const at::Tensor*> given;
  for (const named_tensor& t : state) given.emplace(t.name, &t.tensor);
  for (const named_tensor& target : mine) {
    const auto found = given.find(target.name);
    if (found == given.end() || !found->second->sizes().equals(target.tensor.sizes()) ||
        found->second->scalar_type() != target.tensor.scalar_type()) {
      throw_error<std::invalid_argument>(
          "fsdp(): this rank's state has no {} '{}' of the layout it holds ({}); it was saved from another "
          "model or over another number of ranks",
          found == given.end() ? "tensor" : "matching", target.name, target.spec().layout());
    }
  }
  if (given.size() != mine.size()) {
    throw_error<std::invalid_argument>("fsdp(): this rank's state holds tensors the model does not");
  }
  torch::NoGradGuard no_grad;
  for (const named_tensor& target : mine) at::Tensor(target.tensor).detach().copy_(*given.at(target.name));
}

int fsdp_engine::shard_group_size(const strategy_context&) const { return state_->mesh().shard_size(); }

std::optional<at::Tensor> fsdp_engine::reshard_local(strategy_context&, const std::string& name,
                                                     const std::vector<at::Tensor>& shards) const {
  std::optional<at::Tensor> mine;
  state_->for_each_group([&](const param_group& group) {
    for (const sharded_param& p : group.params()) {
      if (p.name() == name) mine = p.rows_from_shards(shards, state_->mesh().shard_rank());
    }
  });
  return mine;
}

tensor_state fsdp_engine::full_state(strategy_context& context) {
  // The shards' own dtype, gathered: the master weights, not the compute copies of mixed precision.
  sharding::fsdp_state& s = *state_;
  std::unordered_map<std::string, at::Tensor> masters;
  s.for_each_group([&](const param_group& group) {
    std::vector<at::Tensor> whole = group.gather_masters(s.comm());
    for (std::size_t i = 0; i < whole.size(); ++i) masters.emplace(group.params()[i].name(), std::move(whole[i]));
  });
  tensor_state full;
  for (const named_tensor& t : module_state(context.module())) {
    const auto master = masters.find(t.name);
    full.push_back({t.name, master != masters.end() ? master->second : t.tensor.detach().clone()});
  }
  return full;
}

void fsdp_engine::explain_forward_failure(strategy_context& context, std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& failure) {
    // What loom's layers say when their weight is at rest, or LibTorch when another operation reads
    // a tensor whose storage fsdp freed: a plain c10::Error (no type or code of its own), whose text
    // is the only sign.
    const auto* aten = dynamic_cast<const c10::Error*>(&failure);
    const std::string_view text = aten != nullptr ? aten->what_without_backtrace() : std::string_view();
    const bool read_at_rest = dynamic_cast<const nn::parameters_at_rest*>(&failure) != nullptr ||
                              text.find("out of bounds for storage of size 0") != std::string_view::npos ||
                              text.find("its data is not allocated yet") != std::string_view::npos;
    if (read_at_rest && state_->awaits_branch()) {
      context.fail(
          fmt::format("fsdp(): a branch of the model ('{}' or another) was used without being entered through "
                      "loom::nn::Branch: its parameters are sharded at rest and gathered once a pass takes the branch, "
                      "through the Branch type's forward, not the inner module's",
                      state_->branches().front().name));
    }
    const param_group* skipped = state_->next_unit();
    if (!read_at_rest || skipped == nullptr) return;
    context.fail(fmt::format(
        "fsdp(): unit '{}' was used without being entered through loom::nn::Unit: its parameters are sharded "
        "at rest and gathered only when its forward is called through the Unit type "
        "(blocks[i]->as<loom::nn::Unit<Block>>()->forward(x)), not the inner block's",
        skipped->name()));
  } catch (...) {
  }
}

void fsdp_engine::with_full_parameters(strategy_context&, const std::function<void()>& change) {
  // On the master weights in their own dtype, so that a change (merge, loading) loses no precision.
  sharding::fsdp_state& s = *state_;
  s.hold_masters();
  // Also when `change` throws (a user's call inside job.with_whole_module): the rows go back, locally.
  struct release_on_exit {
    sharding::fsdp_state& state;
    ~release_on_exit() { state.release_masters(); }
  } const release{s};
  change();
}

void fsdp_engine::load_full_state(strategy_context& context, const tensor_state& full) {
  with_full_parameters(context, [&] { load_module_state(context.module(), full); });
}

}  // namespace loom

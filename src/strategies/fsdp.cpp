#include <loom/strategies/fsdp.hpp>

#include <loom/lora/adapter.hpp>
#include <loom/runtime/text.hpp>
#include <loom/strategies/buckets.hpp>

#include <ATen/ATen.h>
#include <ATen/native/Resize.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <stdexcept>
#include <unordered_map>

namespace loom {
namespace {

constexpr std::int64_t mib = 1024 * 1024;

// At rest a parameter keeps its tensor (identity, shape, autograd metadata) but not its bytes.
void release_storage(const at::Tensor& tensor) {
  at::native::resize_bytes_cpu(tensor.storage().unsafeGetStorageImpl(), 0);
}

void restore_storage(const at::Tensor& tensor) {
  at::native::resize_bytes_cpu(tensor.storage().unsafeGetStorageImpl(), tensor.nbytes());
}

// One parameter sharded on dim 0: rank r owns rows [r·s, min(rows, (r+1)·s)), s = ceil(rows / N),
// stored as s rows (zero-padded past the end), flat. A 0-d parameter counts as one row.
struct sharded_param {
  std::string name;
  at::Tensor full;   // the module's parameter
  at::Tensor shard;  // this rank's rows: what the optimizer steps
  std::int64_t rows = 1;
  std::int64_t row_numel = 1;
  std::int64_t shard_rows = 1;
  bool trainable = false;

  [[nodiscard]] std::int64_t shard_numel() const { return shard_rows * row_numel; }
  // The full parameter as rows × row_numel, sharing its storage but not its version counter, so
  // that writing a gather into it does not invalidate what autograd saved for backward.
  [[nodiscard]] at::Tensor full_rows() const { return full.variable_data().view({rows, row_numel}); }
};

// One dtype's all-gather of a group, issued and not yet unpacked.
struct gather_in_flight {
  std::vector<std::size_t> indices;
  at::Tensor gathered;  // every rank's packed shards, rank after rank
  pending_collective work;
};

struct param_group;

// One dtype's reduce-scatter of a group's gradients, issued and not yet accumulated.
struct reduction_in_flight {
  param_group* group;
  std::vector<std::size_t> indices;
  at::Tensor output;  // this rank's averaged shard gradients, then a used-flag per parameter
  pending_collective work;
};

// A unit, or the root: gathered and resharded together.
struct param_group {
  std::string name;
  std::vector<sharded_param> params;
  bool gathered = false;
  std::vector<gather_in_flight> in_flight;  // a prefetch: issued, not yet waited for
  bool reduced = false;                     // its reduce-scatter was issued in this step

  // Indices of params by dtype, in registration order: one collective per dtype.
  [[nodiscard]] std::map<c10::ScalarType, std::vector<std::size_t>> by_dtype(bool trainable_only) const {
    std::map<c10::ScalarType, std::vector<std::size_t>> groups;
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (!trainable_only || params[i].trainable) groups[params[i].full.scalar_type()].push_back(i);
    }
    return groups;
  }
  [[nodiscard]] bool has_trainable() const {
    return std::any_of(params.begin(), params.end(), [](const sharded_param& p) { return p.trainable; });
  }
};

sharded_param make_sharded(const std::string& name, const at::Tensor& parameter, int rank, int world) {
  sharded_param p;
  p.name = name;
  p.full = parameter;
  p.rows = parameter.dim() == 0 ? 1 : parameter.size(0);
  p.row_numel = p.rows == 0 ? 0 : parameter.numel() / p.rows;
  p.shard_rows = (p.rows + world - 1) / world;
  p.trainable = parameter.requires_grad();
  at::Tensor mine = at::zeros({p.shard_rows, p.row_numel}, parameter.options().requires_grad(false));
  const std::int64_t first = std::min(p.rows, rank * p.shard_rows);
  const std::int64_t count = std::min(p.rows, first + p.shard_rows) - first;
  if (count > 0) mine.narrow(0, 0, count).copy_(p.full_rows().narrow(0, first, count));
  p.shard = mine.view(-1).requires_grad_(p.trainable);
  return p;
}

std::vector<tensor_spec> shard_specs(const param_group& group, const std::vector<std::size_t>& indices) {
  std::vector<tensor_spec> specs;
  for (std::size_t i : indices) {
    const sharded_param& p = group.params[i];
    specs.push_back({p.name, {p.shard_numel()}, p.full.scalar_type()});
  }
  return specs;
}

}  // namespace

struct fsdp_engine::state : nn::unit_hooks {
  strategy_context* context = nullptr;
  fsdp_options settings;
  param_group root;
  std::vector<param_group> units;
  std::vector<nn::unit_base*> unit_modules;
  std::vector<named_tensor> adapters;       // replicated, sorted by name
  std::vector<at::Tensor> optimizer_order;  // shards and adapters, in the module's registration order
  std::vector<std::vector<std::size_t>> buckets;
  std::size_t next_unit = 0;  // the unit whose forward comes next in this step
  std::vector<reduction_in_flight> reductions;

  ~state() override {
    for (nn::unit_base* unit : unit_modules) unit->detach();
  }

  collectives& comm() const { return context->rt().comm(); }

  // The root, then the units in registration order.
  template <class F>
  void for_each_group(F&& each) {
    each(root);
    for (param_group& unit : units) each(unit);
  }
  template <class F>
  void for_each_group(F&& each) const {
    each(root);
    for (const param_group& unit : units) each(unit);
  }
  int world() const { return context->rt().world_size(); }

  // Issues the group's all-gathers (one per dtype, the shards packed) without waiting for them, so
  // that the next unit's gather overlaps this one's compute.
  void start_gather(param_group& group) {
    if (group.gathered || !group.in_flight.empty()) return;
    for (const auto& [dtype, indices] : group.by_dtype(false)) {
      std::vector<at::Tensor> shards;
      for (std::size_t i : indices) shards.push_back(group.params[i].shard.detach());
      at::Tensor packed = at::cat(shards);
      at::Tensor all = at::empty({world() * packed.numel()}, packed.options());
      pending_collective work = comm().all_gather(packed, all);
      group.in_flight.push_back({indices, all, std::move(work)});
    }
  }

  // Waits for the group's all-gathers and writes every rank's rows into the full parameters.
  void finish_gather(param_group& group) {
    if (group.gathered) return;
    start_gather(group);
    for (gather_in_flight& flight : group.in_flight) {
      flight.work.wait();
      const std::int64_t per_rank = flight.gathered.numel() / world();
      at::Tensor by_rank = flight.gathered.view({world(), per_rank});
      std::int64_t offset = 0;
      for (std::size_t i : flight.indices) {
        sharded_param& p = group.params[i];
        restore_storage(p.full);
        at::Tensor rows = by_rank.narrow(1, offset, p.shard_numel()).reshape({world() * p.shard_rows, p.row_numel});
        p.full_rows().copy_(rows.narrow(0, 0, p.rows));
        offset += p.shard_numel();
      }
    }
    group.in_flight.clear();
    group.gathered = true;
  }

  void reshard(param_group& group) {
    if (!group.gathered) return;
    for (sharded_param& p : group.params) release_storage(p.full);
    group.gathered = false;
  }

  // Issues the reduce-scatter of the group's trainable gradients (SUM, divided by N), one per dtype,
  // and frees the full gradients; finish_reductions() waits and writes the shards' gradients. A
  // rank that produced no gradient for a parameter sends zeros and a used-flag of 0, so that a
  // parameter no rank used keeps no gradient, as under local().
  void start_reduce_scatter(param_group& group) {
    if (group.reduced) return;
    group.reduced = true;
    for (const auto& [dtype, indices] : group.by_dtype(true)) {
      const auto flags = static_cast<std::int64_t>(indices.size());
      std::int64_t per_rank = flags;
      for (std::size_t i : indices) per_rank += group.params[i].shard_numel();
      at::Tensor input = at::zeros({world(), per_rank}, group.params[indices.front()].shard.options());
      std::int64_t offset = 0;
      for (std::size_t k = 0; k < indices.size(); ++k) {
        sharded_param& p = group.params[indices[k]];
        const at::Tensor& grad = p.full.grad();
        if (grad.defined()) {
          at::Tensor padded = at::zeros({world() * p.shard_rows, p.row_numel}, grad.options());
          padded.narrow(0, 0, p.rows).copy_(grad.reshape({p.rows, p.row_numel}));
          input.narrow(1, offset, p.shard_numel()).copy_(padded.view({world(), p.shard_numel()}));
          input.select(1, per_rank - flags + static_cast<std::int64_t>(k)).fill_(1);
          p.full.mutable_grad().reset();
        }
        offset += p.shard_numel();
      }
      at::Tensor output = at::empty({per_rank}, input.options());
      pending_collective work = comm().reduce_scatter(input.view(-1), output, reduce_op::mean);
      reductions.push_back({&group, indices, output, std::move(work)});
    }
  }

  // Waits for the reduce-scatters in the order they were issued and accumulates each into the
  // shards' gradients (accumulating, as after no_sync).
  void finish_reductions() {
    for (reduction_in_flight& r : reductions) {
      r.work.wait();
      const auto flags = static_cast<std::int64_t>(r.indices.size());
      const at::Tensor used_by = r.output.narrow(0, r.output.numel() - flags, flags).to(at::kDouble);
      std::int64_t offset = 0;
      for (std::size_t k = 0; k < r.indices.size(); ++k) {
        sharded_param& p = r.group->params[r.indices[k]];
        if (used_by[static_cast<std::int64_t>(k)].item<double>() > 0) {
          at::Tensor slice = r.output.narrow(0, offset, p.shard_numel());
          at::Tensor& shard_grad = p.shard.mutable_grad();
          shard_grad = shard_grad.defined() ? shard_grad.add_(slice) : slice.clone();
        }
        offset += p.shard_numel();
      }
    }
    reductions.clear();
    for_each_group([](param_group& group) {
      if (!group.reduced) return;
      group.reduced = false;
      for (const sharded_param& p : group.params) {
        // A gradient after the group's reduce-scatter began would be lost: never silently.
        TORCH_CHECK(!p.full.grad().defined(), "loom: fsdp(): '", p.name,
                    "' received a gradient after its unit's reduce-scatter began; please report this model");
      }
    });
  }

  // Averages the replicated adapters' gradients across ranks, bucket by bucket in name order; a
  // rank that did not use an adapter contributes zeros, and an adapter that no rank used keeps no
  // gradient.
  void all_reduce_adapters() {
    for (const auto& bucket : buckets) {
      std::vector<at::Tensor> parts;
      for (std::size_t i : bucket) {
        const at::Tensor& t = adapters[i].tensor;
        parts.push_back(t.grad().defined() ? t.grad().reshape(-1) : at::zeros({t.numel()}, t.options()));
      }
      at::Tensor used = at::empty({static_cast<std::int64_t>(bucket.size())}, parts.front().options());
      for (std::size_t k = 0; k < bucket.size(); ++k) {
        used[static_cast<std::int64_t>(k)].fill_(adapters[bucket[k]].tensor.grad().defined() ? 1 : 0);
      }
      parts.push_back(used);
      at::Tensor flat = at::cat(parts);
      comm().all_reduce(flat, reduce_op::mean).wait();
      std::int64_t offset = 0;
      const std::int64_t flags = flat.numel() - static_cast<std::int64_t>(bucket.size());
      for (std::size_t k = 0; k < bucket.size(); ++k) {
        at::Tensor tensor = adapters[bucket[k]].tensor;
        const bool anyone = flat[flags + static_cast<std::int64_t>(k)].item<double>() > 0;
        if (anyone) tensor.mutable_grad() = flat.narrow(0, offset, tensor.numel()).view_as(tensor).clone();
        offset += tensor.numel();
      }
    }
  }

  void before_forward(std::size_t unit) override {
    if (unit != next_unit) {
      context->fail(fmt::format(
          "fsdp(): unit '{}' ran its forward where the schedule has {}: every rank must run every unit, in the "
          "order the model registers them, once a step (a unit that a rank skips would leave the others waiting "
          "in its all-gather)",
          units[unit].name, next_unit < units.size() ? "unit '" + units[next_unit].name + "'" : "no more units"));
    }
    ++next_unit;
    finish_gather(units[unit]);
    if (unit + 1 < units.size()) start_gather(units[unit + 1]);
  }

  void after_forward(std::size_t unit, const std::vector<at::Tensor>& outputs) override {
    const bool backward_follows =
        at::GradMode::is_enabled() && std::any_of(outputs.begin(), outputs.end(),
                                                  [](const at::Tensor& t) { return t.defined() && t.requires_grad(); });
    // The gradient of this unit's output is complete once the next unit's backward is done: then
    // its reduce-scatter starts, and this unit is gathered for its own backward while the previous
    // one's gather is issued.
    for (const at::Tensor& output : outputs) {
      if (!backward_follows || !output.defined() || !output.requires_grad()) continue;
      at::Tensor hooked = output;
      hooked.register_hook([this, unit](const at::Tensor&) {
        if (context->sync_gradients() && unit + 1 < units.size()) start_reduce_scatter(units[unit + 1]);
        if (!settings.reshard_after_forward) return;
        finish_gather(units[unit]);
        if (unit > 0) start_gather(units[unit - 1]);
      });
    }
    if (!settings.reshard_after_forward) return;
    if (outputs.empty() && at::GradMode::is_enabled()) return;  // nothing to hang a pre-backward gather on
    // The last unit's backward comes first: FSDP2 keeps it gathered rather than gather it again.
    if (backward_follows && unit + 1 == units.size()) return;
    reshard(units[unit]);
  }
};

fsdp_engine::fsdp_engine(const fsdp_options& settings) : settings_(settings) {}

void fsdp_engine::setup(strategy_context& context) {
  const runtime& rt = context.rt();
  context.require_process_group(name);
  if (rt.device().type() != c10::kCPU) {
    throw std::invalid_argument("loom: fsdp(): this build shards CPU parameters only; use ddp() on " +
                                rt.device().str());
  }
  state_ = std::make_shared<state>();
  state& s = *state_;
  s.context = &context;
  s.settings = settings_;
  s.root.name = "(root)";

  // Which group owns each parameter: the innermost unit around it, else the root.
  std::unordered_map<const c10::TensorImpl*, std::string> owner;
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> unit_modules;
  for (const auto& item : context.module().named_modules("", /*include_self=*/false)) {
    if (auto* unit = dynamic_cast<nn::unit_base*>(item.value().get())) {
      unit_modules.emplace_back(item.key(), item.value());
      unit->attach(&s, s.units.size());
      s.unit_modules.push_back(unit);
      s.units.emplace_back().name = item.key();
    }
  }
  const auto unit_of = [&](const std::string& parameter) -> param_group& {
    for (std::size_t u = unit_modules.size(); u-- > 0;) {
      const std::string& prefix = unit_modules[u].first;
      if (parameter.starts_with(prefix + ".")) return s.units[u];
    }
    return s.root;
  };
  for (const auto& item : context.module().named_parameters()) {
    const std::string& name = item.key();
    const at::Tensor& parameter = item.value();
    param_group& group = unit_of(name);
    const auto [seen, first] = owner.emplace(parameter.unsafeGetTensorImpl(), group.name);
    if (!first) {
      throw std::invalid_argument(fmt::format(
          "loom: fsdp(): parameter '{}' is shared by {} and {}: a unit must own its parameters; tie them inside "
          "one unit, or leave both users in the root",
          name, seen->second, group.name));
    }
    if (parameter.requires_grad() && lora_adapter::is_adapter_parameter(name)) {
      s.adapters.push_back({name, parameter});
      s.optimizer_order.push_back(parameter);
      continue;
    }
    if (!parameter.is_contiguous() || parameter.storage_offset() != 0 ||
        parameter.storage().nbytes() != parameter.nbytes()) {
      throw std::invalid_argument(fmt::format(
          "loom: fsdp(): parameter '{}' does not own its storage (a view or a slice of another tensor), so it "
          "cannot be sharded: register it as a tensor of its own",
          name));
    }
    if (!parameter.storage().resizable()) {
      // Loaded from an archive, say: give it bytes of its own (the tensor, and so every handle to it,
      // stays the same), which fsdp can release at rest.
      torch::NoGradGuard no_grad;
      at::Tensor(parameter).set_data(parameter.detach().clone());
    }
    group.params.push_back(make_sharded(name, parameter, rt.rank(), rt.world_size()));
    if (group.params.back().trainable) s.optimizer_order.push_back(group.params.back().shard);
  }
  s.for_each_group([&](param_group& group) {
    group.gathered = true;
    s.reshard(group);
  });
  std::sort(s.adapters.begin(), s.adapters.end(),
            [](const named_tensor& a, const named_tensor& b) { return a.name < b.name; });
  std::vector<std::size_t> by_name(s.adapters.size());
  std::iota(by_name.begin(), by_name.end(), std::size_t{0});
  const auto cap = static_cast<std::int64_t>(settings_.bucket_cap_mb) * mib;
  s.buckets = assign_buckets(s.adapters, by_name, [cap](std::size_t) { return cap; });

  // The schedule: the root's gather, each unit's in forward order; in backward each unit's gather
  // again (when it was resharded after forward) and reduce-scatter in reverse order, the root's
  // reduce-scatter, then the adapters' all-reduce.
  collective_schedule& schedule = context.schedule();
  const auto add = [&](collective_op op, step_phase phase, const param_group& group, bool trainable_only) {
    for (const auto& [dtype, indices] : group.by_dtype(trainable_only)) {
      schedule.add({op, phase, shard_specs(group, indices), "world"});
    }
  };
  add(collective_op::all_gather, step_phase::forward, s.root, false);
  for (const param_group& unit : s.units) add(collective_op::all_gather, step_phase::forward, unit, false);
  for (std::size_t u = s.units.size(); u-- > 0;) {
    // The last unit stays gathered from its forward to its backward.
    if (settings_.reshard_after_forward && u + 1 < s.units.size()) {
      add(collective_op::all_gather, step_phase::backward, s.units[u], false);
    }
  }
  for (std::size_t u = s.units.size(); u-- > 0;)
    add(collective_op::reduce_scatter, step_phase::backward, s.units[u], true);
  add(collective_op::reduce_scatter, step_phase::backward, s.root, true);
  for (const auto& bucket : s.buckets) {
    schedule_entry entry{collective_op::all_reduce, step_phase::backward, {}, "world"};
    for (std::size_t i : bucket) entry.tensors.push_back(s.adapters[i].spec());
    schedule.add(std::move(entry));
  }

  std::int64_t at_rest = 0;
  std::vector<std::string> gathered;
  for (const sharded_param& p : s.root.params) at_rest += p.shard.numel() * p.shard.element_size();
  for (const param_group& unit : s.units) {
    std::int64_t full = 0;
    for (const sharded_param& p : unit.params) {
      at_rest += p.shard.numel() * p.shard.element_size();
      full += static_cast<std::int64_t>(p.full.nbytes());
    }
    gathered.push_back(fmt::format("{:.2f}", static_cast<double>(full) / mib));
  }
  for (const named_tensor& a : s.adapters) at_rest += static_cast<std::int64_t>(a.tensor.nbytes());
  if (s.units.empty()) {
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
                             counted(static_cast<std::int64_t>(s.units.size()), "unit"),
                             counted(rt.world_size(), "rank"), fmt::join(gathered, ", ")));
  }
  context.note(fmt::format("fsdp: {:.2f} MiB of parameters at rest on this rank ({} replicated)",
                           static_cast<double>(at_rest) / mib,
                           counted(static_cast<std::int64_t>(s.adapters.size()), "adapter tensor")));
}

void fsdp_engine::before_forward(strategy_context&) {
  state_->next_unit = 0;
  state_->finish_gather(state_->root);
}

void fsdp_engine::after_backward(strategy_context& context) {
  state& s = *state_;
  if (s.next_unit != s.units.size()) {
    context.fail(fmt::format(
        "fsdp(): unit '{}' was not entered through loom::nn::Unit in this step: call its forward through the "
        "Unit type (blocks[i]->as<loom::nn::Unit<Block>>()->forward(x)), not the inner block's",
        s.units[s.next_unit].name));
  }
  for (std::size_t u = s.units.size(); u-- > 0;) {
    s.finish_gather(s.units[u]);  // gathered already unless the unit had no backward (its outputs needed none)
  }
  if (context.sync_gradients()) {
    for (std::size_t u = s.units.size(); u-- > 0;) s.start_reduce_scatter(s.units[u]);  // those not yet begun
    s.start_reduce_scatter(s.root);
    s.finish_reductions();
    s.all_reduce_adapters();
  }
  for (param_group& unit : s.units) s.reshard(unit);
  s.reshard(s.root);
}

std::vector<at::Tensor> fsdp_engine::optimizer_parameters(const strategy_context&) const {
  return state_->optimizer_order;
}

double fsdp_engine::clip_grad_norm(strategy_context& context, double max_norm, double norm_type) {
  const bool infinity = std::isinf(norm_type) && norm_type > 0;
  if (!infinity && norm_type != 2.0) {
    throw std::invalid_argument(fmt::format(
        "loom: fsdp(): clip_grad_norm supports norm_type 2 and infinity (std::numeric_limits<double>::infinity()), "
        "got {}",
        norm_type));
  }
  // Shards add up across ranks; the replicated adapters, identical on every rank, count once.
  const auto contribution = [&](const at::Tensor& grad) {
    return infinity ? grad.abs().max().to(at::kDouble) : grad.to(at::kDouble).square().sum();
  };
  at::Tensor sharded = at::zeros({1}, at::kDouble);
  state_->for_each_group([&](const param_group& group) {
    for (const sharded_param& p : group.params) {
      if (!p.shard.grad().defined()) continue;
      sharded = infinity ? at::maximum(sharded, contribution(p.shard.grad())) : sharded + contribution(p.shard.grad());
    }
  });
  double total = 0;
  if (infinity) {
    at::Tensor all = at::empty({context.rt().world_size()}, at::kDouble);
    context.rt().comm().all_gather(sharded, all).wait();
    total = all.max().item<double>();
  } else {
    context.rt().comm().all_reduce(sharded, reduce_op::sum).wait();
    total = sharded.item<double>();
  }
  for (const named_tensor& a : state_->adapters) {
    if (!a.tensor.grad().defined()) continue;
    const double part = contribution(a.tensor.grad()).item<double>();
    total = infinity ? std::max(total, part) : total + part;
  }
  const double norm = infinity ? total : std::sqrt(total);
  const double scale = max_norm / (norm + 1e-6);
  if (scale < 1) {
    for (at::Tensor& t : optimizer_parameters(context)) {
      if (t.grad().defined()) t.mutable_grad().mul_(scale);
    }
  }
  return norm;
}

tensor_state fsdp_engine::local_state(strategy_context& context) const {
  tensor_state local;
  state_->for_each_group([&](const param_group& group) {
    for (const sharded_param& p : group.params) local.push_back({p.name, p.shard});
  });
  for (const named_tensor& a : state_->adapters) local.push_back(a);
  for (const auto& item : context.module().named_buffers()) local.push_back({item.key(), item.value()});
  return local;
}

tensor_state fsdp_engine::full_state(strategy_context& context) {
  state& s = *state_;
  s.for_each_group([&](param_group& group) { s.finish_gather(group); });
  tensor_state full;
  for (const named_tensor& t : module_state(context.module())) full.push_back({t.name, t.tensor.detach().clone()});
  s.for_each_group([&](param_group& group) { s.reshard(group); });
  return full;
}

void fsdp_engine::explain_forward_failure(strategy_context& context, std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error& failure) {
    // What LibTorch says when an operation reads a tensor whose storage fsdp released at rest.
    const std::string_view text = failure.what_without_backtrace();
    const state& s = *state_;
    const bool read_at_rest = text.find("out of bounds for storage of size 0") != std::string_view::npos ||
                              text.find("its data is not allocated yet") != std::string_view::npos;
    if (!read_at_rest || s.next_unit >= s.units.size()) return;
    context.fail(fmt::format(
        "fsdp(): unit '{}' was used without being entered through loom::nn::Unit: its parameters are sharded "
        "at rest and gathered only when its forward is called through the Unit type "
        "(blocks[i]->as<loom::nn::Unit<Block>>()->forward(x)), not the inner block's",
        s.units[s.next_unit].name));
  } catch (...) {
  }
}

void fsdp_engine::with_full_parameters(strategy_context& context, const std::function<void()>& change) {
  state& s = *state_;
  s.for_each_group([&](param_group& group) { s.finish_gather(group); });
  change();
  const runtime& rt = context.rt();
  s.for_each_group([&](param_group& group) {
    torch::NoGradGuard no_grad;
    for (sharded_param& p : group.params) p.shard.copy_(make_sharded(p.name, p.full, rt.rank(), rt.world_size()).shard);
    s.reshard(group);
  });
}

void fsdp_engine::load_full_state(strategy_context& context, const tensor_state& full) {
  with_full_parameters(context, [&] { load_module_state(context.module(), full); });
}

}  // namespace loom

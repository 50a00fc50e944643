#include <loom/strategies/fsdp.hpp>

#include <loom/lora/adapter.hpp>
#include <loom/runtime/failpoints.hpp>
#include <loom/runtime/text.hpp>
#include <loom/schedule/cursor.hpp>
#include <loom/strategies/buckets.hpp>
#include <loom/strategies/fsdp/param_group.hpp>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <unordered_map>

namespace loom {
namespace {

using sharding::param_group;
using sharding::sharded_param;

constexpr std::int64_t mib = 1024 * 1024;
constexpr std::size_t no_collective = static_cast<std::size_t>(-1);

// The LoRA adapters, replicated on every rank. Their gradients are averaged after backward, bucket
// by bucket in name order; a rank that did not use an adapter contributes zeros, and an adapter
// that no rank used keeps no gradient.
class replicated_adapters {
 public:
  replicated_adapters() = default;
  replicated_adapters(std::vector<named_tensor> adapters, std::int64_t bucket_cap_bytes)
      : adapters_(std::move(adapters)) {
    std::sort(adapters_.begin(), adapters_.end(),
              [](const named_tensor& a, const named_tensor& b) { return a.name < b.name; });
    std::vector<std::size_t> by_name(adapters_.size());
    std::iota(by_name.begin(), by_name.end(), std::size_t{0});
    buckets_ = assign_buckets(adapters_, by_name, [bucket_cap_bytes](std::size_t) { return bucket_cap_bytes; });
  }

  [[nodiscard]] const std::vector<named_tensor>& tensors() const noexcept { return adapters_; }
  [[nodiscard]] std::size_t bucket_count() const noexcept { return buckets_.size(); }

  [[nodiscard]] schedule_entry bucket_entry(std::size_t bucket) const {
    schedule_entry entry{collective_op::all_reduce, step_phase::backward, {}, "world"};
    for (std::size_t i : buckets_[bucket]) entry.tensors.push_back(adapters_[i].spec());
    return entry;
  }

  // Packs the bucket's gradients (zeros where none) and a used-flag each, and issues their mean.
  void start_all_reduce(std::size_t bucket, collectives& comm) {
    std::vector<at::Tensor> parts;
    for (std::size_t i : buckets_[bucket]) {
      const at::Tensor& t = adapters_[i].tensor;
      parts.push_back(t.grad().defined() ? t.grad().reshape(-1) : at::zeros({t.numel()}, t.options()));
    }
    std::vector<float> used;
    for (std::size_t i : buckets_[bucket]) used.push_back(adapters_[i].tensor.grad().defined() ? 1.0F : 0.0F);
    parts.push_back(at::tensor(used).to(parts.front().options()));
    at::Tensor packed = at::cat(parts);
    pending_collective work = comm.all_reduce(packed, reduce_op::mean);
    failpoint("step.backward");  // mid backward, with the replicated adapters' all-reduce under way
    in_flight_.push_back({bucket, std::move(packed), std::move(work)});
  }

  void finish_all_reduces() {
    for (reduction& r : in_flight_) {
      r.work.wait();
      const std::vector<std::size_t>& bucket = buckets_[r.bucket];
      const auto count = static_cast<std::int64_t>(bucket.size());
      // Which adapters had a gradient on some rank: a few flags, read on the host.
      const at::Tensor used_by = r.packed.narrow(0, r.packed.numel() - count, count).to(at::kDouble).cpu();
      const auto* used = used_by.const_data_ptr<double>();
      std::int64_t offset = 0;
      for (std::size_t k = 0; k < bucket.size(); ++k) {
        const at::Tensor& tensor = adapters_[bucket[k]].tensor;
        if (used[k] > 0) tensor.mutable_grad() = r.packed.narrow(0, offset, tensor.numel()).view_as(tensor).clone();
        offset += tensor.numel();
      }
    }
    in_flight_.clear();
  }

 private:
  struct reduction {
    std::size_t bucket;
    at::Tensor packed;
    pending_collective work;
  };
  std::vector<named_tensor> adapters_;  // sorted by name
  std::vector<std::vector<std::size_t>> buckets_;
  std::vector<reduction> in_flight_;
};

}  // namespace

struct fsdp_engine::state : nn::unit_hooks {
  // A unit's collectives in the step: indices into the cursor.
  struct unit_collectives {
    std::size_t forward_gather = no_collective;
    std::size_t backward_gather = no_collective;  // none when the unit stays whole into its backward
    std::size_t reduce_scatter = no_collective;
  };

  strategy_context* context = nullptr;
  fsdp_options settings;
  param_group root{"(root)"};
  std::vector<param_group> units;
  std::vector<nn::unit_base*> unit_modules;
  replicated_adapters adapters;
  std::vector<at::Tensor> optimizer_order;  // shards and adapters, in the module's registration order
  schedule_cursor cursor;
  std::size_t root_gather = no_collective;
  std::vector<unit_collectives> unit_steps;
  std::size_t next_unit = 0;  // the unit whose forward comes next in this step

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

  void issue_through(std::size_t collective) {
    if (collective != no_collective) cursor.issue_through(collective, context->sync_gradients());
  }

  // The collectives of a step, declared in the order every rank issues them; the schedule gets
  // their entries in that order. Forward: the root's gather, then each unit's (the next one
  // prefetched during a unit's forward). Backward, as each unit's output gradient is complete (its
  // successor's backward done): the successor's reduce-scatter, then the gather of the unit before
  // it (prefetched; the last unit stays whole from its forward). After backward: the first unit's
  // and the root's reduce-scatters, and the adapters' all-reduces.
  void declare_collectives(collective_schedule& schedule) {
    const auto declare = [&](std::vector<schedule_entry> entries, schedule_cursor::issue_fn issue, bool gradient_sync) {
      return cursor.declare(schedule, std::move(entries), std::move(issue), gradient_sync);
    };
    const auto gather = [&](param_group& group, step_phase phase) {
      return declare(
          group.gather_entries(phase), [this, &group] { group.start_gather(comm()); }, false);
    };
    const auto reduce_scatter = [&](param_group& group) {
      return declare(
          group.reduce_scatter_entries(), [this, &group] { group.start_reduce_scatter(comm()); }, true);
    };
    const std::size_t count = units.size();
    unit_steps.assign(count, {});
    root_gather = gather(root, step_phase::forward);
    for (std::size_t u = 0; u < count; ++u) unit_steps[u].forward_gather = gather(units[u], step_phase::forward);
    for (std::size_t u = count; u-- > 0;) {
      if (u + 1 < count) unit_steps[u + 1].reduce_scatter = reduce_scatter(units[u + 1]);
      if (settings.reshard_after_forward && u > 0) {
        unit_steps[u - 1].backward_gather = gather(units[u - 1], step_phase::backward);
      }
    }
    if (count > 0) unit_steps[0].reduce_scatter = reduce_scatter(units[0]);
    reduce_scatter(root);
    for (std::size_t b = 0; b < adapters.bucket_count(); ++b) {
      declare(
          {adapters.bucket_entry(b)}, [this, b] { adapters.start_all_reduce(b, comm()); }, true);
    }
  }

  void before_forward(std::size_t unit) override {
    if (unit != next_unit) fail_out_of_order(unit);
    ++next_unit;
    issue_through(unit_steps[unit].forward_gather);
    units[unit].finish_gather();
    if (unit + 1 < units.size()) issue_through(unit_steps[unit + 1].forward_gather);
  }

  [[noreturn]] void fail_out_of_order(std::size_t unit) const {
    const std::string expected = next_unit < units.size()
                                     ? fmt::format("unit '{}' next, {}", units[next_unit].name(),
                                                   cursor.describe(unit_steps[next_unit].forward_gather))
                                     : std::string("no more units in this step");
    context->fail(fmt::format(
        "fsdp(): unit '{}' ran its forward where the schedule has {}; this rank would have waited on {} instead. "
        "Every rank must run every unit, in the order the model registers them, once a step (a unit that a rank "
        "skips would leave the others waiting in its all-gather)",
        units[unit].name(), expected, cursor.describe(unit_steps[unit].forward_gather)));
  }

  void after_forward(std::size_t unit, const std::vector<at::Tensor>& outputs) override {
    const bool backward_follows =
        at::GradMode::is_enabled() && std::any_of(outputs.begin(), outputs.end(),
                                                  [](const at::Tensor& t) { return t.defined() && t.requires_grad(); });
    for (const at::Tensor& output : outputs) {
      if (!backward_follows || !output.defined() || !output.requires_grad()) continue;
      at::Tensor(output).register_hook([this, unit](const at::Tensor&) { before_backward(unit); });
    }
    if (!settings.reshard_after_forward) return;
    if (outputs.empty() && at::GradMode::is_enabled()) return;  // nothing to hang a pre-backward gather on
    // The last unit's backward comes first: FSDP2 keeps it whole rather than gather it again.
    if (backward_follows && unit + 1 == units.size()) return;
    units[unit].reshard();
  }

  // The gradient of the unit's output is complete, so its successor's backward is done: that one's
  // reduce-scatter starts, the previous unit's gather is issued, and this unit is whole again.
  void before_backward(std::size_t unit) {
    if (unit + 1 < units.size()) issue_through(unit_steps[unit + 1].reduce_scatter);
    if (unit > 0) issue_through(unit_steps[unit - 1].backward_gather);
    issue_through(unit_steps[unit].backward_gather);
    units[unit].finish_gather();
  }
};

fsdp_engine::fsdp_engine(const fsdp_options& settings) : settings_(settings) {}

void fsdp_engine::setup(strategy_context& context) {
  const runtime& rt = context.rt();
  context.require_process_group(name);
  state_ = std::make_shared<state>();
  state& s = *state_;
  s.context = &context;
  s.settings = settings_;

  // Which group owns each parameter: the innermost unit around it, else the root.
  std::vector<std::string> unit_prefixes;
  for (const auto& item : context.module().named_modules("", /*include_self=*/false)) {
    if (auto* unit = dynamic_cast<nn::unit_base*>(item.value().get())) {
      unit->attach(&s, s.units.size());
      s.unit_modules.push_back(unit);
      s.units.emplace_back(item.key());
      unit_prefixes.push_back(item.key() + ".");
    }
  }
  const auto group_of = [&](const std::string& parameter) -> param_group& {
    for (std::size_t u = unit_prefixes.size(); u-- > 0;) {
      if (parameter.starts_with(unit_prefixes[u])) return s.units[u];
    }
    return s.root;
  };
  std::unordered_map<const c10::TensorImpl*, std::string> owner;
  std::vector<named_tensor> adapters;
  for (const auto& item : context.module().named_parameters()) {
    const std::string& name = item.key();
    const at::Tensor& parameter = item.value();
    param_group& group = group_of(name);
    const auto [seen, first] = owner.emplace(parameter.unsafeGetTensorImpl(), group.name());
    if (!first) {
      throw std::invalid_argument(fmt::format(
          "loom: fsdp(): parameter '{}' is shared by {} and {}: a unit must own its parameters; tie them inside "
          "one unit, or leave both users in the root",
          name, seen->second, group.name()));
    }
    if (parameter.requires_grad() && lora_adapter::is_adapter_parameter(name)) {
      adapters.push_back({name, parameter});
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
    group.add(sharded_param(name, parameter, rt.rank(), rt.world_size()));
    if (group.params().back().trainable()) s.optimizer_order.push_back(group.params().back().shard());
  }
  s.for_each_group([](param_group& group) { group.reshard(); });
  s.adapters = replicated_adapters(std::move(adapters), static_cast<std::int64_t>(settings_.bucket_cap_mb) * mib);
  s.declare_collectives(context.schedule());
  describe_layout(context);
}

void fsdp_engine::describe_layout(strategy_context& context) const {
  const state& s = *state_;
  const auto bytes = [](const at::Tensor& t) { return static_cast<std::int64_t>(t.nbytes()); };
  std::int64_t at_rest = 0;
  std::vector<std::string> gathered;
  s.for_each_group([&](const param_group& group) {
    std::int64_t full = 0;
    for (const sharded_param& p : group.params()) {
      at_rest += bytes(p.shard());
      full += bytes(p.full());
    }
    if (&group != &s.root) gathered.push_back(fmt::format("{:.2f}", static_cast<double>(full) / mib));
  });
  for (const named_tensor& a : s.adapters.tensors()) at_rest += bytes(a.tensor);
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
                             counted(context.rt().world_size(), "rank"), fmt::join(gathered, ", ")));
  }
  context.note(fmt::format("fsdp: {:.2f} MiB of parameters at rest on this rank ({} replicated)",
                           static_cast<double>(at_rest) / mib,
                           counted(static_cast<std::int64_t>(s.adapters.tensors().size()), "adapter tensor")));
}

void fsdp_engine::before_forward(strategy_context&) {
  state& s = *state_;
  s.cursor.begin_step();
  s.next_unit = 0;
  s.issue_through(s.root_gather);
  s.root.finish_gather();
}

void fsdp_engine::after_backward(strategy_context& context) {
  state& s = *state_;
  if (s.next_unit != s.units.size()) {
    context.fail(fmt::format(
        "fsdp(): unit '{}' was not entered through loom::nn::Unit in this step: call its forward through the "
        "Unit type (blocks[i]->as<loom::nn::Unit<Block>>()->forward(x)), not the inner block's",
        s.units[s.next_unit].name()));
  }
  // What the units' hooks did not issue (a unit whose output needed no gradient on this rank).
  s.cursor.issue_rest(context.sync_gradients());
  for (param_group& unit : s.units) {
    unit.finish_gather();
    unit.reshard();
  }
  s.root.reshard();
  if (!context.sync_gradients()) return;
  for (std::size_t u = s.units.size(); u-- > 0;) s.units[u].finish_reduce_scatter();
  s.root.finish_reduce_scatter();
  s.adapters.finish_all_reduces();
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
  const auto on_device = at::TensorOptions(at::kDouble).device(context.rt().device());
  at::Tensor sharded = at::zeros({1}, on_device);
  state_->for_each_group([&](const param_group& group) {
    for (const sharded_param& p : group.params()) {
      const at::Tensor& grad = p.shard().grad();
      if (!grad.defined()) continue;
      sharded = infinity ? at::maximum(sharded, contribution(grad)) : sharded + contribution(grad);
    }
  });
  double total = 0;
  if (infinity) {
    at::Tensor all = at::empty({context.rt().world_size()}, on_device);
    context.rt().comm().all_gather(sharded, all).wait();
    total = all.max().item<double>();
  } else {
    context.rt().comm().all_reduce(sharded, reduce_op::sum).wait();
    total = sharded.item<double>();
  }
  for (const named_tensor& a : state_->adapters.tensors()) {
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
    for (const sharded_param& p : group.params()) local.push_back({p.name(), p.shard()});
  });
  for (const named_tensor& a : state_->adapters.tensors()) local.push_back(a);
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
      throw std::invalid_argument(fmt::format(
          "loom: fsdp(): this rank's state has no {} '{}' of the layout it holds ({}); it was saved from another "
          "model or over another number of ranks",
          found == given.end() ? "tensor" : "matching", target.name, target.spec().layout()));
    }
  }
  if (given.size() != mine.size()) {
    throw std::invalid_argument("loom: fsdp(): this rank's state holds tensors the model does not");
  }
  torch::NoGradGuard no_grad;
  for (const named_tensor& target : mine) at::Tensor(target.tensor).detach().copy_(*given.at(target.name));
}

std::optional<at::Tensor> fsdp_engine::reshard_local(strategy_context& context, const std::string& name,
                                                     const std::vector<at::Tensor>& shards) const {
  std::optional<at::Tensor> mine;
  state_->for_each_group([&](const param_group& group) {
    for (const sharded_param& p : group.params()) {
      if (p.name() == name) mine = p.rows_from_shards(shards, context.rt().rank());
    }
  });
  return mine;
}

tensor_state fsdp_engine::full_state(strategy_context& context) {
  state& s = *state_;
  s.for_each_group([&](param_group& group) { group.gather_now(s.comm()); });
  tensor_state full;
  for (const named_tensor& t : module_state(context.module())) full.push_back({t.name, t.tensor.detach().clone()});
  s.for_each_group([](param_group& group) { group.reshard(); });
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
        s.units[s.next_unit].name()));
  } catch (...) {
  }
}

void fsdp_engine::with_full_parameters(strategy_context& context, const std::function<void()>& change) {
  state& s = *state_;
  s.for_each_group([&](param_group& group) { group.gather_now(s.comm()); });
  change();
  const int rank = context.rt().rank();
  s.for_each_group([rank](param_group& group) {
    for (const sharded_param& p : group.params()) p.reshard_values(rank);
    group.reshard();
  });
}

void fsdp_engine::load_full_state(strategy_context& context, const tensor_state& full) {
  with_full_parameters(context, [&] { load_module_state(context.module(), full); });
}

}  // namespace loom

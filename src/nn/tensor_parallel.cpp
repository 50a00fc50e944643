#include <loom/nn/tensor_parallel.hpp>

#include "group_collectives.hpp"

#include <loom/base/text.hpp>
#include <loom/nn/embedding.hpp>
#include <loom/nn/linear.hpp>
#include <loom/runtime/tensor_group.hpp>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/autograd.h>

#include <algorithm>
#include <functional>
#include <stdexcept>
#include <utility>

namespace loom::nn {

std::string_view name_of(parallel_style style) noexcept {
  switch (style) {
    case parallel_style::colwise: return "colwise";
    case parallel_style::rowwise: return "rowwise";
    case parallel_style::vocab: return "vocab";
    case parallel_style::gradient_summed: return "gradient_summed";
  }
  return {};
}

namespace {

// What the group's autograd nodes keep for their backward.
struct split_site : torch::CustomClassHolder {
  explicit split_site(tensor_split* split_, std::optional<std::size_t> exchange_ = std::nullopt)
      : split(split_), exchange(exchange_) {}
  tensor_split* split;
  std::optional<std::size_t> exchange;  // the declared exchange it is, checked as it is issued
};

struct enter_group : torch::autograd::Function<enter_group> {
  static at::Tensor forward(torch::autograd::AutogradContext* context, const c10::intrusive_ptr<split_site>& site,
                            const at::Tensor& whole) {
    context->saved_data["site"] = c10::IValue::make_capsule(site);
    return whole.view_as(whole);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* context,
                                                 const torch::autograd::variable_list& grads) {
    const auto site = c10::static_intrusive_pointer_cast<split_site>(context->saved_data["site"].toCapsule());
    if (site->exchange) site->split->check_issued(*site->exchange, /*in_backward_pass=*/true);
    return {at::Tensor(), summed(site->split->group(), grads[0])};
  }
};

struct sum_over_group : torch::autograd::Function<sum_over_group> {
  static at::Tensor forward(torch::autograd::AutogradContext* context, const c10::intrusive_ptr<split_site>& site,
                            const at::Tensor& part) {
    context->saved_data["site"] = c10::IValue::make_capsule(site);
    return summed(site->split->group(), part);
  }
  // Every rank uses the sum on its own part: each rank's gradient reaches every part.
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* context,
                                                 const torch::autograd::variable_list& grads) {
    const auto site = c10::static_intrusive_pointer_cast<split_site>(context->saved_data["site"].toCapsule());
    return {at::Tensor(), summed(site->split->group(), grads[0])};
  }
};

struct reduce_over_group : torch::autograd::Function<reduce_over_group> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const c10::intrusive_ptr<split_site>& site,
                            const at::Tensor& partial) {
    if (site->exchange) site->split->check_issued(*site->exchange, /*in_backward_pass=*/false);
    return summed(site->split->group(), partial);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 const torch::autograd::variable_list& grads) {
    return {at::Tensor(), grads[0]};
  }
};

struct gather_over_group : torch::autograd::Function<gather_over_group> {
  static at::Tensor forward(torch::autograd::AutogradContext* context, const c10::intrusive_ptr<split_site>& site,
                            const at::Tensor& part, std::int64_t dim) {
    context->saved_data["site"] = c10::IValue::make_capsule(site);
    context->saved_data["dim"] = dim;
    return gathered(site->split->group(), part, dim);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* context,
                                                 const torch::autograd::variable_list& grads) {
    const auto site = c10::static_intrusive_pointer_cast<split_site>(context->saved_data["site"].toCapsule());
    return {at::Tensor(), site->split->slice(grads[0], context->saved_data["dim"].toInt()), at::Tensor()};
  }
};

// Cross-entropy over a vocabulary split across the group: log Σ exp(z) from the group's row maxima
// and sums, the target's logit from the rank that holds it. The gradient of each rank's logits is its
// slice of softmax(z) - onehot(target), which needs nothing from the others.
struct vocab_parallel_cross_entropy : torch::autograd::Function<vocab_parallel_cross_entropy> {
  static at::Tensor forward(torch::autograd::AutogradContext* context, const c10::intrusive_ptr<split_site>& site,
                            const at::Tensor& logits, const at::Tensor& targets) {
    const tensor_group& group = site->split->group();
    const at::Tensor z = logits.to(at::kFloat);
    at::Tensor row_max = std::get<0>(z.max(-1));
    group.comm().all_reduce(row_max, reduce_op::max).wait();
    const at::Tensor exponentials = (z - row_max.unsqueeze(-1)).exp();
    const at::Tensor sums = summed(group, exponentials.sum(-1));
    const std::int64_t first = site->split->slice_begin(z.size(-1) * group.size());
    const at::Tensor held = targets.ge(first).logical_and(targets.lt(first + z.size(-1)));
    const at::Tensor columns = at::where(held, targets - first, 0);
    const at::Tensor target_logits = summed(group, z.gather(-1, columns.unsqueeze(-1)).squeeze(-1) * held);
    const at::Tensor counted_tokens = targets.ne(-100);
    const at::Tensor losses = (sums.log() + row_max - target_logits) * counted_tokens;
    context->save_for_backward({exponentials, sums, columns, held, counted_tokens});
    context->saved_data["dtype"] = static_cast<std::int64_t>(logits.scalar_type());
    return losses.sum();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* context,
                                                 const torch::autograd::variable_list& grads) {
    const auto saved = context->get_saved_variables();
    const at::Tensor &exponentials = saved[0], &sums = saved[1], &columns = saved[2], &held = saved[3],
                     &counted_tokens = saved[4];
    at::Tensor grad = exponentials / sums.unsqueeze(-1);
    grad.scatter_add_(-1, columns.unsqueeze(-1), -held.unsqueeze(-1).to(grad.scalar_type()));
    grad.mul_((grads[0] * counted_tokens).unsqueeze(-1));
    const auto dtype = static_cast<at::ScalarType>(context->saved_data["dtype"].toInt());
    return {at::Tensor(), grad.to(dtype), at::Tensor()};
  }
};

// Whether a dotted module name matches a pattern whose `*` parts stand for any one part.
bool matches(std::string_view pattern, std::string_view name) {
  while (true) {
    const std::size_t pattern_dot = pattern.find('.'), name_dot = name.find('.');
    const std::string_view part = pattern.substr(0, pattern_dot), their = name.substr(0, name_dot);
    if (part != "*" && part != their) return false;
    if (pattern_dot == std::string_view::npos || name_dot == std::string_view::npos) {
      return pattern_dot == std::string_view::npos && name_dot == std::string_view::npos;
    }
    pattern.remove_prefix(pattern_dot + 1);
    name.remove_prefix(name_dot + 1);
  }
}

}  // namespace

tensor_split::tensor_split(std::shared_ptr<tensor_group> group) : group_(std::move(group)) {}
tensor_split::~tensor_split() = default;

int tensor_split::size() const noexcept { return group_->size(); }
int tensor_split::rank() const noexcept { return group_->rank(); }

at::Tensor tensor_split::slice(const at::Tensor& whole, std::int64_t dim) const {
  const std::int64_t part = whole.size(dim) / size();
  return whole.narrow(dim, part * rank(), part).clone();
}

at::Tensor tensor_split::enter(const at::Tensor& whole, std::optional<std::size_t> exchange) {
  return enter_group::apply(c10::make_intrusive<split_site>(this, exchange), whole);
}

at::Tensor tensor_split::reduce(const at::Tensor& partial, std::optional<std::size_t> exchange) {
  return reduce_over_group::apply(c10::make_intrusive<split_site>(this, exchange), partial);
}

at::Tensor tensor_split::gather(const at::Tensor& part, std::int64_t dim) {
  return gather_over_group::apply(c10::make_intrusive<split_site>(this), part, dim);
}

at::Tensor tensor_split::sum(const at::Tensor& part) {
  return sum_over_group::apply(c10::make_intrusive<split_site>(this), part);
}

at::Tensor tensor_split::summed_cross_entropy(const at::Tensor& logits, const at::Tensor& targets) {
  return vocab_parallel_cross_entropy::apply(c10::make_intrusive<split_site>(this), logits, targets);
}

std::size_t tensor_split::declare(const std::string& module, std::vector<parallel_module::exchange> exchanges) {
  const std::size_t first = declared_.size();
  for (parallel_module::exchange& e : exchanges) {
    (e.phase == step_phase::forward ? forward_order_ : backward_order_).push_back(declared_.size());
    declared_.push_back({module, std::move(e)});
  }
  // Backward reaches the layers in the reverse of their forward order.
  std::sort(backward_order_.begin(), backward_order_.end(), std::greater<>());
  return first;
}

void tensor_split::begin_forward() noexcept {
  next_forward_ = 0;
  in_backward_ = false;
}

void tensor_split::begin_backward() {
  if (next_forward_ > 0 && next_forward_ < forward_order_.size()) {
    throw_error<std::logic_error>(
        "tensor_parallel: the forward issued {} of the {} summed outputs its split layers declare (the next was {}): "
        "every split layer of the model runs once in each forward",
        next_forward_, forward_order_.size(), describe(forward_order_[next_forward_], step_phase::forward));
  }
  next_backward_ = 0;
  in_backward_ = true;
}

std::string tensor_split::describe(std::size_t exchange, step_phase phase) const {
  const declared& d = declared_.at(exchange);
  return fmt::format("{}'s {} ({} {})", d.module, d.exchange.what, to_string(d.exchange.op), to_string(phase));
}

void tensor_split::check_issued(std::size_t exchange, bool in_backward_pass) {
  const auto refuse = [&](step_phase phase, const std::string& expected) {
    throw_error<std::logic_error>(
        "tensor_parallel: the model issued {} where the schedule has {}: every split layer runs once in each "
        "forward, in the order the model registered it, so that the ranks of a group sum the same tensors",
        describe(exchange, phase), expected);
  };
  if (in_backward_pass) {
    // The last one again is allowed: a layer that ran more than once (the chunked loss's head, over
    // each chunk).
    const std::size_t from = next_backward_ > 0 ? next_backward_ - 1 : 0;
    const auto found =
        std::find(backward_order_.begin() + static_cast<std::ptrdiff_t>(from), backward_order_.end(), exchange);
    if (found == backward_order_.end()) {
      refuse(step_phase::backward, next_backward_ < backward_order_.size()
                                       ? describe(backward_order_[next_backward_], step_phase::backward)
                                       : std::string("no more in this backward"));
    }
    next_backward_ = static_cast<std::size_t>(found - backward_order_.begin()) + 1;
    return;
  }
  if (in_backward_) {  // a recomputed unit's forward, inside backward
    if (std::find(forward_order_.begin(), forward_order_.end(), exchange) == forward_order_.end()) {
      refuse(step_phase::recompute, "one of the forward's");
    }
    return;
  }
  // A forward outside job.forward (a user's own call inside with_whole_module) starts over.
  if (next_forward_ >= forward_order_.size() ||
      (forward_order_[next_forward_] != exchange && !forward_order_.empty() && forward_order_.front() == exchange)) {
    next_forward_ = 0;
  }
  if (next_forward_ >= forward_order_.size() || forward_order_[next_forward_] != exchange) {
    refuse(step_phase::forward, next_forward_ < forward_order_.size()
                                    ? describe(forward_order_[next_forward_], step_phase::forward)
                                    : std::string("no more in this forward"));
  }
  ++next_forward_;
}

std::vector<schedule_entry> tensor_split::schedule_entries(at::ScalarType compute_type,
                                                           const std::vector<std::string>& recomputed) const {
  const auto entry = [&](const declared& d, step_phase phase) {
    return schedule_entry{
        .op = d.exchange.op,
        .phase = phase,
        .tensors = {tensor_spec{
            fmt::format("{} {}", d.module, d.exchange.what), {d.exchange.values_per_token}, compute_type}},
        .group = group_->role(),
        .per_token = true};
  };
  const auto in_recomputed_unit = [&](const std::string& module) {
    return std::any_of(recomputed.begin(), recomputed.end(),
                       [&](const std::string& unit) { return module.starts_with(unit + "."); });
  };
  std::vector<schedule_entry> entries;
  for (const declared& d : declared_) {
    if (d.exchange.phase == step_phase::forward) entries.push_back(entry(d, step_phase::forward));
  }
  for (auto d = declared_.rbegin(); d != declared_.rend(); ++d) {
    if (d->exchange.phase == step_phase::forward && in_recomputed_unit(d->module)) {
      entries.push_back(entry(*d, step_phase::recompute));
    }
  }
  for (auto d = declared_.rbegin(); d != declared_.rend(); ++d) {
    if (d->exchange.phase == step_phase::backward) entries.push_back(entry(*d, step_phase::backward));
  }
  return entries;
}

void tensor_split::sum_gradient_of(at::Tensor& parameter) {
  parameter.register_hook([this](const at::Tensor& grad) { return summed(*group_, grad); });
}

void tensor_split::record(const split_parameter& cut) {
  cut_.push_back(cut);
  dim_of_.insert_or_assign(cut.name, cut.dim);
}

std::optional<std::int64_t> tensor_split::split_dim(const std::string& parameter) const {
  const auto found = dim_of_.find(parameter);
  return found == dim_of_.end() ? std::nullopt : std::optional(found->second);
}

void tensor_split::gather_whole(std::vector<named_tensor>& tensors) const {
  torch::NoGradGuard no_grad;
  for (named_tensor& t : tensors) {
    if (const auto dim = split_dim(t.name)) t.tensor = gathered(*group_, t.tensor.detach(), *dim);
  }
}

void tensor_split::keep_parts(std::vector<named_tensor>& tensors) const {
  for (named_tensor& t : tensors) {
    if (const auto dim = split_dim(t.name)) t.tensor = slice(t.tensor, *dim);
  }
}

void split_layers(torch::nn::Module& model, std::string_view model_name, const std::vector<parallel_layer>& plan,
                  const std::shared_ptr<tensor_split>& split) {
  const int k = split->size();
  if (plan.empty()) {
    throw_error<std::invalid_argument>(
        "tensor_parallel({}): {} marks no parallel layer: give it a tensor_parallel_plan() const that names its "
        "colwise and rowwise loom::nn::Linear layers (docs/tensor_parallel.md), or leave tensor_parallel out",
        k, model_name);
  }
  // The heads first: a size that does not divide them is the clearest sentence.
  for (const auto& [name, attention] : find_sequence_modules(model).attentions) attention->keep_heads(k, name);
  // In the order the model registered its modules, which is the order of its forward's exchanges
  // (each module's its first plan entry's).
  std::vector<bool> matched(plan.size(), false);
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    const std::string& name = item.key();
    const auto rule = std::find_if(plan.begin(), plan.end(),
                                   [&](const parallel_layer& layer) { return matches(layer.pattern, name); });
    if (rule == plan.end()) continue;
    matched[static_cast<std::size_t>(rule - plan.begin())] = true;
    torch::nn::Module& module = *item.value();
    if (rule->style == parallel_style::gradient_summed) {
      for (auto& parameter : module.parameters(/*recurse=*/false)) {
        if (parameter.requires_grad()) split->sum_gradient_of(parameter);
      }
      continue;
    }
    auto* parallel = dynamic_cast<parallel_module*>(&module);
    const std::optional<parallel_module::cut> cut = parallel ? parallel->cut_by(rule->style) : std::nullopt;
    if (!cut) {
      throw_error<std::invalid_argument>(
          "tensor_parallel({}): {}'s tensor_parallel_plan marks {} {}, which is a {}: mark loom::nn::Linear layers "
          "colwise or rowwise, loom::nn::Embedding tables vocab, and a module of the model's own that implements "
          "loom::nn::parallel_module with a style it takes",
          k, model_name, name, name_of(rule->style), module.name());
    }
    if (cut->size % k != 0) {
      throw_error<std::invalid_argument>(
          "tensor_parallel({}): {}'s {} has {} {}, which {} ranks cannot split evenly: give a size that divides it", k,
          model_name, name, cut->size, cut->what, k);
    }
    for (split_parameter& parameter : parallel->split(rule->style, split)) {
      split->record({name + "." + parameter.name, parameter.dim});
    }
    parallel->declared_at(split->declare(name, parallel->exchanges()));
  }
  for (std::size_t i = 0; i < plan.size(); ++i) {
    if (matched[i]) continue;
    throw_error<std::invalid_argument>(
        "tensor_parallel({}): {}'s tensor_parallel_plan marks {} {}, which matches no module: name modules as the "
        "model registers them, a `*` standing for one part of the name",
        k, model_name, plan[i].pattern, name_of(plan[i].style));
  }
}

}  // namespace loom::nn

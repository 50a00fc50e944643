#include <loom/nn/sequence_parallel.hpp>

#include "group_collectives.hpp"

#include <loom/base/text.hpp>
#include <loom/precision/attention.hpp>
#include <loom/runtime/host_reads.hpp>
#include <loom/runtime/sequence_group.hpp>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/autograd.h>

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace loom::nn {
namespace {

using exchange = sequence_split::exchange;

// What an exchange's autograd node keeps for its backward: the split and the attention it serves.
struct exchange_site : torch::CustomClassHolder {
  exchange_site(std::shared_ptr<sequence_split> split_, std::size_t index_) : split(std::move(split_)), index(index_) {}
  std::shared_ptr<sequence_split> split;
  std::size_t index;
};

// [batch, tokens, heads, dim] of this rank's tokens and every head to [batch, k·tokens, heads / k,
// dim] of every token and this rank's heads: block j of the heads goes to rank j, and rank i's
// tokens come back as block i of the sequence.
at::Tensor sequence_to_heads(sequence_split& split, std::size_t site, exchange what, bool backward,
                             const at::Tensor& x) {
  const std::int64_t k = split.size(), batch = x.size(0), tokens = x.size(1), heads = x.size(2), dim = x.size(3);
  const at::Tensor send = x.view({batch, tokens, k, heads / k, dim}).permute({2, 0, 1, 3, 4}).contiguous();
  at::Tensor received = at::empty_like(send);
  split.all_to_all(site, what, backward, send, received);
  return received.permute({1, 0, 2, 3, 4}).reshape({batch, k * tokens, heads / k, dim});
}

// The reverse: [batch, k·tokens, heads, dim] of this rank's heads to [batch, tokens, k·heads, dim]
// of its tokens.
at::Tensor heads_to_sequence(sequence_split& split, std::size_t site, exchange what, bool backward,
                             const at::Tensor& y) {
  const std::int64_t k = split.size(), batch = y.size(0), tokens = y.size(1) / k, heads = y.size(2), dim = y.size(3);
  const at::Tensor send = y.view({batch, k, tokens, heads, dim}).permute({1, 0, 2, 3, 4}).contiguous();
  at::Tensor received = at::empty_like(send);
  split.all_to_all(site, what, backward, send, received);
  return received.permute({1, 2, 0, 3, 4}).reshape({batch, tokens, k * heads, dim});
}

struct to_heads_exchange : torch::autograd::Function<to_heads_exchange> {
  static at::Tensor forward(torch::autograd::AutogradContext* context, const c10::intrusive_ptr<exchange_site>& site,
                            const at::Tensor& x) {
    context->saved_data["site"] = c10::IValue::make_capsule(site);
    return sequence_to_heads(*site->split, site->index, exchange::to_heads, false, x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* context,
                                                 const torch::autograd::variable_list& grads) {
    const auto site = c10::static_intrusive_pointer_cast<exchange_site>(context->saved_data["site"].toCapsule());
    return {at::Tensor(), heads_to_sequence(*site->split, site->index, exchange::to_heads, true, grads[0])};
  }
};

struct to_sequence_exchange : torch::autograd::Function<to_sequence_exchange> {
  static at::Tensor forward(torch::autograd::AutogradContext* context, const c10::intrusive_ptr<exchange_site>& site,
                            const at::Tensor& y) {
    context->saved_data["site"] = c10::IValue::make_capsule(site);
    return heads_to_sequence(*site->split, site->index, exchange::to_sequence, false, y);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* context,
                                                 const torch::autograd::variable_list& grads) {
    const auto site = c10::static_intrusive_pointer_cast<exchange_site>(context->saved_data["site"].toCapsule());
    return {at::Tensor(), sequence_to_heads(*site->split, site->index, exchange::to_sequence, true, grads[0])};
  }
};

// What the group-wide operations of Sequence keep for backward.
struct group_site : torch::CustomClassHolder {
  explicit group_site(std::shared_ptr<sequence_split> split_) : split(std::move(split_)) {}
  std::shared_ptr<sequence_split> split;
};

struct gather_sequence : torch::autograd::Function<gather_sequence> {
  static at::Tensor forward(torch::autograd::AutogradContext* context, const c10::intrusive_ptr<group_site>& site,
                            const at::Tensor& part, std::int64_t dim) {
    context->saved_data["site"] = c10::IValue::make_capsule(site);
    context->saved_data["dim"] = dim;
    return gathered(site->split->group(), part, dim);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* context,
                                                 const torch::autograd::variable_list& grads) {
    const auto site = c10::static_intrusive_pointer_cast<group_site>(context->saved_data["site"].toCapsule());
    return {at::Tensor(), scattered(site->split->group(), grads[0], context->saved_data["dim"].toInt()), at::Tensor()};
  }
};

struct sum_over_group : torch::autograd::Function<sum_over_group> {
  static at::Tensor forward(torch::autograd::AutogradContext* context, const c10::intrusive_ptr<group_site>& site,
                            const at::Tensor& part) {
    context->saved_data["site"] = c10::IValue::make_capsule(site);
    return summed(site->split->group(), part);
  }
  // Every rank of the group holds the sum, so each rank's gradient reaches every part.
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* context,
                                                 const torch::autograd::variable_list& grads) {
    const auto site = c10::static_intrusive_pointer_cast<group_site>(context->saved_data["site"].toCapsule());
    return {at::Tensor(), summed(site->split->group(), grads[0])};
  }
};

// In the dtype autocast would attend in, so that a kernel called directly computes what SDPA would.
at::Tensor in_compute_type(const at::Tensor& t) {
  return at::autocast::is_autocast_enabled(t.device().type())
             ? t.to(at::autocast::get_autocast_dtype(t.device().type()))
             : t;
}

// Whether ATen's flash kernel takes these: CUDA, fp16 or bf16, a head size it was built for.
bool flash_takes(const at::Tensor& q) {
  const at::ScalarType type = in_compute_type(q).scalar_type();
  const std::int64_t head_dim = q.size(3);
  return q.is_cuda() && (type == at::kHalf || type == at::kBFloat16) && head_dim % 8 == 0 && head_dim <= 256;
}

// Packed attention through the variable-length flash kernel: the batch's rows laid end to end, each
// document a sequence of its own, grouped-query heads as they are (the kernel serves each key-value
// head to its query heads in order), the sliding window as the kernel's left window.
at::Tensor attend_varlen(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const attention_options& options, const packed_documents& documents) {
  const std::int64_t batch = q.size(0), tokens = q.size(1);
  const auto flat = [&](const at::Tensor& t) {
    return in_compute_type(t).reshape({batch * tokens, t.size(2), t.size(3)});
  };
  // The kernel's window: the keys this many tokens behind and ahead of the query, -1 for all of them.
  const std::int64_t behind = options.sliding_window > 0 ? options.sliding_window - 1 : -1;
  const std::int64_t ahead = options.sliding_window > 0 ? 0 : -1;
  const auto attended = at::_flash_attention_forward(
      flat(q), flat(k), flat(v), documents.offsets, documents.offsets, documents.longest, documents.longest,
      /*dropout_p=*/0.0, options.causal, /*return_debug_mask=*/false, options.scale, behind, ahead);
  return std::get<0>(attended).view({batch, tokens, q.size(2), q.size(3)});
}

// Attention over [batch, tokens, heads, dim] tensors, grouped-query heads repeated in order; with
// `documents` a query sees only keys of its own document.
at::Tensor attend(const at::Tensor& q, at::Tensor k, at::Tensor v, const attention_options& options,
                  const std::optional<packed_documents>& documents) {
  if (documents && flash_takes(q)) return attend_varlen(q, k, v, options, *documents);
  const std::int64_t heads = q.size(2), kv_heads = k.size(2);
  if (kv_heads != heads) {
    k = k.repeat_interleave(heads / kv_heads, 2);
    v = v.repeat_interleave(heads / kv_heads, 2);
  }
  std::optional<at::Tensor> mask;
  if (options.sliding_window > 0 || documents) {
    // Key j is in query i's window when i - sliding_window < j <= i (transformers' sliding mask).
    const at::Tensor positions = at::arange(q.size(1), at::TensorOptions(at::kLong).device(q.device()));
    const at::Tensor behind = positions.unsqueeze(1) - positions.unsqueeze(0);
    at::Tensor allowed = options.causal ? behind.ge(0) : at::ones_like(behind, at::kBool);
    if (options.sliding_window > 0) allowed = allowed.logical_and(behind.lt(options.sliding_window));
    if (documents) {
      const at::Tensor same = documents->ids.unsqueeze(2).eq(documents->ids.unsqueeze(1));  // [batch, query, key]
      allowed = same.logical_and(allowed).unsqueeze(1);
    }
    mask = allowed;
  }
  return loom::scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask,
                                            options.causal && !mask.has_value(), options.scale)
      .transpose(1, 2);
}

std::string_view exchange_name(exchange what) { return what == exchange::to_heads ? "q,k,v" : "attended"; }

}  // namespace

sequence_split::sequence_split(std::shared_ptr<sequence_group> group, std::vector<site> sites,
                               at::ScalarType compute_type)
    : group_(std::move(group)), sites_(std::move(sites)), compute_type_(compute_type) {
  const int k = group_->size();
  for (const site& s : sites_) {
    const std::int64_t heads = s.options.heads;
    if (heads % k != 0) {
      throw_error<std::invalid_argument>(
          "sequence_parallel({}): {} has {}, which {} ranks cannot split evenly: give a size that divides its "
          "heads (each rank attends with heads / k of them over the whole sequence)",
          k, s.name, counted(heads, "attention head"), k);
    }
  }
  for (std::size_t i = 0; i < sites_.size(); ++i) {
    declare(i, exchange::to_heads, step_phase::forward);
    declare(i, exchange::to_sequence, step_phase::forward);
  }
  forward_count_ = declared_.size();
  // Backward runs the units from the last; a recomputed unit first runs its forward again.
  for (std::size_t end = sites_.size(); end > 0;) {
    std::size_t begin = end - 1;
    if (sites_[begin].recomputed) {
      while (begin > 0 && sites_[begin - 1].recomputed && sites_[begin - 1].unit == sites_[end - 1].unit) --begin;
      for (std::size_t i = begin; i < end; ++i) {
        declare(i, exchange::to_heads, step_phase::recompute);
        declare(i, exchange::to_sequence, step_phase::recompute);
      }
    }
    for (std::size_t i = end; i > begin; --i) {
      declare(i - 1, exchange::to_sequence, step_phase::backward);
      declare(i - 1, exchange::to_heads, step_phase::backward);
    }
    end = begin;
  }
}

sequence_split::~sequence_split() = default;

int sequence_split::size() const noexcept { return group_->size(); }
int sequence_split::rank() const noexcept { return group_->rank(); }

std::int64_t sequence_split::kv_heads_sent(std::size_t site_index) const {
  const attention_options& options = sites_.at(site_index).options;
  // Key-value heads k does not divide are repeated to one a query head first, so that every rank
  // gets the key-value heads of its query heads.
  return options.key_value_heads() % group_->size() == 0 ? options.key_value_heads() : options.heads;
}

void sequence_split::declare(std::size_t site_index, exchange what, step_phase phase) {
  const site& s = sites_[site_index];
  const std::int64_t heads =
      what == exchange::to_heads ? s.options.heads + 2 * kv_heads_sent(site_index) : s.options.heads;
  schedule_entry entry{
      .op = collective_op::all_to_all,
      .phase = phase,
      .tensors = {tensor_spec{
          fmt::format("{} {}", s.name, exchange_name(what)), {heads, s.options.head_dim}, compute_type_}},
      .group = group_->role(),
      .per_token = true};
  declared_.push_back({site_index, what, phase, std::move(entry)});
}

std::vector<schedule_entry> sequence_split::schedule_entries() const {
  std::vector<schedule_entry> entries;
  for (const declared& d : declared_) entries.push_back(d.entry);
  return entries;
}

void sequence_split::begin_forward() {
  next_ = 0;
  in_backward_ = false;
}

void sequence_split::begin_backward() {
  if (next_ < forward_count_ && next_ > 0) {
    throw_error<std::logic_error>(
        "sequence_parallel: the forward issued {} of the {} all-to-alls its attentions declare (the next was {}): "
        "every loom::nn::Attention of the model runs once in each forward, in the order it was registered",
        next_, forward_count_, describe(declared_[next_].site_index, declared_[next_].what, step_phase::forward));
  }
  next_ = forward_count_;
  in_backward_ = true;
}

std::string sequence_split::describe(std::size_t site_index, exchange what, step_phase phase) const {
  return fmt::format("{}'s {} {} all-to-all", sites_[site_index].name, exchange_name(what), to_string(phase));
}

// Over the group's host collectives: the shapes are host values, and comparing them reads nothing on
// the device (a device all-gather would need a read of its result every forward).
void sequence_split::agree_on_length(std::int64_t batch, std::int64_t length) {
  const int k = group_->size();
  at::Tensor mine = at::tensor({batch, length}, at::TensorOptions(at::kLong));
  at::Tensor all = at::empty({2 * k}, mine.options());
  group_->host_comm().all_gather(mine, all).wait();
  const std::int64_t* shapes = all.const_data_ptr<std::int64_t>();
  for (int r = 0; r < k; ++r) {
    const std::int64_t their_batch = shapes[2 * r], their_length = shapes[2 * r + 1];
    if (their_batch != batch || their_length != length) {
      throw_error<std::invalid_argument>(
          "sequence_parallel({}): the ranks of {} were given other batches: rank {} of the group {} sequences of {}, "
          "rank {} {} of {}: the ranks of one sequence group read the same batch (choose it by job.data_rank(), not "
          "the rank)",
          k, group_->name(), group_->rank(), batch, counted(length, "token"), r, their_batch,
          counted(their_length, "token"));
    }
  }
  if (length % k != 0) {
    throw_error<std::invalid_argument>(
        "sequence_parallel({}): the sequence has {}, which {} ranks cannot split evenly: give sequences whose length "
        "is a multiple of {} (a language model's may be padded, with labels of -100 on the padding so that its loss "
        "leaves it out; a video model's tokens are its patches, which the latents' frames, height and width decide)",
        k, counted(length, "token"), k, k);
  }
}

void sequence_split::all_to_all(std::size_t site_index, exchange what, bool backward, const at::Tensor& input,
                                at::Tensor& output) {
  const step_phase phase = backward ? step_phase::backward : in_backward_ ? step_phase::recompute : step_phase::forward;
  const auto matches = [&](const declared& d) {
    return d.site_index == site_index && d.what == what && d.phase == phase;
  };
  std::size_t found = next_;
  if (phase == step_phase::forward) {
    if (found >= forward_count_ || !matches(declared_[found])) found = declared_.size();
  } else {
    while (found < declared_.size() && !matches(declared_[found])) ++found;
  }
  if (found >= declared_.size()) {
    throw_error<std::logic_error>(
        "sequence_parallel: the model issued {} where the schedule has {}: every loom::nn::Attention of the model "
        "runs once in each forward, in the order it was registered, so that the ranks of a group exchange the same "
        "tensors",
        describe(site_index, what, phase),
        next_ < declared_.size() ? fmt::format("entry {}, {}", next_, declared_[next_].entry.to_string())
                                 : std::string("no more all-to-alls in this step"));
  }
  if (input.scalar_type() != compute_type_) {
    throw_error<std::logic_error>(
        "sequence_parallel: {} exchanges {} where the schedule declares {}: compute the attention's q, k and v in the "
        "dtype the plan computes in",
        describe(site_index, what, phase), c10::toString(input.scalar_type()), c10::toString(compute_type_));
  }
  next_ = found + 1;
  group_->comm().all_to_all(input, output).wait();
}

AttentionImpl::AttentionImpl(const attention_options& options) : options_(options) {
  if (options_.heads < 1 || options_.key_value_heads() < 1 || options_.heads % options_.key_value_heads() != 0) {
    throw_error<std::invalid_argument>(
        "loom::nn::Attention: {} and {}: give key-value heads that divide the heads (each serves heads / kv_heads "
        "query heads)",
        counted(options_.heads, "head"), counted(options_.key_value_heads(), "key-value head"));
  }
  if (options_.sliding_window < 0 || (options_.sliding_window > 0 && !options_.causal)) {
    throw_error<std::invalid_argument>(
        "loom::nn::Attention: a sliding window of {} for {} attention: give a causal attention a window of 1 or more "
        "tokens, or 0 for none",
        options_.sliding_window, options_.causal ? "causal" : "bidirectional");
  }
}

void AttentionImpl::keep_heads(int k, std::string_view name) {
  const std::int64_t heads = options_.heads, kv_heads = options_.key_value_heads();
  if (heads % k != 0) {
    throw_error<std::invalid_argument>(
        "tensor_parallel({}): {} has {}, which {} ranks cannot split evenly: give a size that divides the heads "
        "(num_attention_heads), as each rank computes heads / k of them",
        k, name, counted(heads, "attention head"), k);
  }
  if (kv_heads % k != 0) {
    throw_error<std::invalid_argument>(
        "tensor_parallel({}): {} has {}, which {} ranks cannot split evenly: give a size that divides the "
        "key-value heads (num_key_value_heads); tensor_parallel does not repeat key-value heads across ranks",
        k, name, counted(kv_heads, "key-value head"), k);
  }
  options_.heads = heads / k;
  options_.kv_heads = kv_heads / k;
}

packed_documents packed_documents::from_positions(const at::Tensor& positions, c10::Device device) {
  // A batch's positions come from the host; from a device, this is a read outside the job's steps.
  const at::Tensor host = read_on_host_uncounted(positions).to(at::kLong).contiguous();
  at::Tensor starts = host.eq(0);
  starts.select(1, 0).fill_(true);
  const at::Tensor first_tokens = starts.flatten().nonzero().flatten();
  const at::Tensor offsets = at::cat({first_tokens, at::full({1}, host.numel(), at::kLong)});
  const std::int64_t longest =
      host.numel() == 0 ? 0 : host_value<std::int64_t>((offsets.slice(0, 1) - offsets.slice(0, 0, -1)).max());
  return {.ids = to_device(starts.cumsum(1), device, at::kLong),
          .offsets = to_device(offsets, device, at::kInt),
          .longest = longest};
}

void AttentionImpl::join(std::shared_ptr<sequence_split> split, std::size_t site_index) {
  split_ = std::move(split);
  site_index_ = site_index;
}

at::Tensor AttentionImpl::forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const std::optional<packed_documents>& documents) {
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4 || q.size(2) != options_.heads ||
      k.size(2) != options_.key_value_heads() || v.size(2) != options_.key_value_heads()) {
    throw_error<std::invalid_argument>(
        "loom::nn::Attention: q [{}], k [{}], v [{}] for {} and {}: give them as [batch, tokens, heads, head_dim]",
        fmt::join(q.sizes(), ", "), fmt::join(k.sizes(), ", "), fmt::join(v.sizes(), ", "),
        counted(options_.heads, "head"), counted(options_.key_value_heads(), "key-value head"));
  }
  const std::int64_t whole = q.size(1) * (split_ ? split_->size() : 1);
  if (documents &&
      (documents->ids.dim() != 2 || documents->ids.size(0) != q.size(0) || documents->ids.size(1) != whole)) {
    throw_error<std::invalid_argument>(
        "loom::nn::Attention: documents [{}] for a batch of {} and {}: give each token's document [batch, tokens], "
        "the whole sequence's on every rank (packed_documents::from_positions)",
        fmt::join(documents->ids.sizes(), ", "), q.size(0), counted(whole, "token"));
  }
  if (!split_) return attend(q, k, v, options_, documents);

  // In the dtype autocast would attend in, so that the exchange carries what attention computes in.
  const auto compute = [](const at::Tensor& t) { return in_compute_type(t); };
  const std::int64_t ranks = split_->size(), batch = q.size(0), tokens = q.size(1), dim = q.size(3);
  const std::int64_t heads = options_.heads, kv_heads = split_->kv_heads_sent(site_index_);
  at::Tensor key = compute(k), value = compute(v);
  if (kv_heads != options_.key_value_heads()) {
    key = key.repeat_interleave(heads / options_.key_value_heads(), 2);
    value = value.repeat_interleave(heads / options_.key_value_heads(), 2);
  }
  // Rank j's q, k and v heads side by side in block j, so that one all-to-all carries all three.
  const auto blocks = [&](const at::Tensor& t, std::int64_t count) {
    return t.reshape({batch, tokens, ranks, count / ranks, dim});
  };
  const at::Tensor packed =
      at::cat({blocks(compute(q), heads), blocks(key, kv_heads), blocks(value, kv_heads)}, 3).flatten(2, 3);
  const auto site = c10::make_intrusive<exchange_site>(split_, site_index_);
  const std::vector<at::Tensor> by_heads =
      to_heads_exchange::apply(site, packed).split({heads / ranks, kv_heads / ranks, kv_heads / ranks}, 2);
  return to_sequence_exchange::apply(site, attend(by_heads[0], by_heads[1], by_heads[2], options_, documents));
}

void SequenceImpl::join(std::shared_ptr<sequence_split> split) { split_ = std::move(split); }

int SequenceImpl::size() const noexcept { return split_ ? split_->size() : 1; }

token_range SequenceImpl::tokens(std::int64_t length) const {
  if (!split_) return {0, length};
  const std::int64_t k = split_->size();
  if (length % k != 0) {
    throw_error<std::invalid_argument>(
        "sequence_parallel({}): a sequence of {} cannot be split evenly over {} ranks: give sequences whose length is "
        "a multiple of {}",
        k, counted(length, "token"), k, k);
  }
  const std::int64_t part = length / k;
  return {split_->rank() * part, (split_->rank() + 1) * part};
}

at::Tensor SequenceImpl::split(const at::Tensor& whole, std::int64_t dim) {
  if (!split_) return whole;
  const std::int64_t along = dim < 0 ? dim + whole.dim() : dim;
  split_->agree_on_length(whole.size(0), whole.size(along));
  return local(whole, along);
}

at::Tensor SequenceImpl::local(const at::Tensor& whole, std::int64_t dim) const {
  if (!split_) return whole;
  const token_range range = tokens(whole.size(dim));
  return whole.narrow(dim, range.begin, range.size());
}

at::Tensor SequenceImpl::whole(const at::Tensor& part, std::int64_t dim) {
  if (!split_) return part;
  return gather_sequence::apply(c10::make_intrusive<group_site>(split_), part, dim < 0 ? dim + part.dim() : dim);
}

at::Tensor SequenceImpl::sum(const at::Tensor& part) {
  if (!split_) return part;
  return sum_over_group::apply(c10::make_intrusive<group_site>(split_), part);
}

sequence_modules find_sequence_modules(torch::nn::Module& model) {
  sequence_modules found;
  for (const auto& item : model.named_modules()) {
    torch::nn::Module* module = item.value().get();
    if (auto* attention = dynamic_cast<AttentionImpl*>(module)) found.attentions.emplace_back(item.key(), attention);
    if (auto* sequence = dynamic_cast<SequenceImpl*>(module)) found.sequences.push_back(sequence);
  }
  return found;
}

}  // namespace loom::nn

#include <loom/models/causal_lm.hpp>

#include <loom/base/text.hpp>
#include <loom/nn/deferred_init.hpp>
#include <loom/nn/recompute.hpp>
#include <loom/precision/attention.hpp>
#include <loom/precision/linear.hpp>
#include <loom/runtime/host_reads.hpp>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/functional/loss.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numbers>
#include <stdexcept>
#include <utility>

namespace loom::models {
namespace {

// The rotary embedding's inverse frequencies, as transformers' rope init functions compute them.
at::Tensor inverse_frequencies(const rope_parameters& rope, std::int64_t head_dim) {
  const at::Tensor inv_freq =
      1.0 / at::pow(rope.theta, at::arange(0, head_dim, 2, at::TensorOptions(at::kLong)).to(at::kFloat) /
                                    static_cast<double>(head_dim));
  switch (rope.type) {
    case rope_parameters::scaling::none: return inv_freq;
    case rope_parameters::scaling::linear: return inv_freq / rope.factor;
    case rope_parameters::scaling::llama3: break;
  }
  const auto old_context = static_cast<double>(rope.original_max_position_embeddings);
  const double low_freq_wavelen = old_context / rope.low_freq_factor;
  const double high_freq_wavelen = old_context / rope.high_freq_factor;
  const at::Tensor wavelen = 2 * std::numbers::pi / inv_freq;
  const at::Tensor scaled = at::where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq);
  const at::Tensor smooth =
      (old_context / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor);
  const at::Tensor smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled;
  const at::Tensor medium = (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
  return at::where(medium, smoothed, scaled).to(at::kFloat);
}

// cos and sin [..., head_dim] of `positions` [...], in fp32 whatever the model computes in, as
// transformers computes them with autocast off.
std::pair<at::Tensor, at::Tensor> rotary_angles(const at::Tensor& positions, const at::Tensor& inv_freq) {
  const at::Tensor freqs = positions.unsqueeze(-1) * inv_freq;
  const at::Tensor angles = at::cat({freqs, freqs}, -1);
  return {angles.cos(), angles.sin()};
}

at::Tensor rotate_half(const at::Tensor& x) {
  const std::int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

loom::nn::Linear linear(std::int64_t in, std::int64_t out, bool bias) {
  return loom::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

// The summed fp32 cross-entropy of one chunk's `logits` [tokens, vocab] against `targets` [tokens].
at::Tensor summed_cross_entropy(const at::Tensor& logits, const at::Tensor& targets) {
  return torch::nn::functional::cross_entropy(
      logits.to(at::kFloat), targets,
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100).reduction(torch::kSum));
}

// What the chunked loss's backward needs besides the hidden states: autograd keeps it in the node's
// context, as a capsule.
struct chunked_loss_state : torch::CustomClassHolder {
  chunked_loss_state(std::function<at::Tensor(const at::Tensor&)> head_, loom::nn::tensor_split* split_,
                     at::Tensor targets_, std::int64_t chunk_, std::vector<at::Tensor> tensors_,
                     loom::nn::forward_conditions conditions_)
      : head(std::move(head_)),
        split(split_),
        targets(std::move(targets_)),
        chunk(chunk_),
        tensors(std::move(tensors_)),
        conditions(std::move(conditions_)) {}
  std::function<at::Tensor(const at::Tensor&)> head;  // the logits of hidden states [tokens, hidden]
  loom::nn::tensor_split* split;                      // the vocabulary's, under tensor_parallel; else none

  // The summed cross-entropy of a chunk's logits: over the split vocabulary without gathering it.
  [[nodiscard]] at::Tensor loss(const at::Tensor& logits, const at::Tensor& chunk_targets) const {
    return split != nullptr ? split->summed_cross_entropy(logits, chunk_targets)
                            : summed_cross_entropy(logits, chunk_targets);
  }
  at::Tensor targets;                       // [tokens], int64; -100 left out
  std::int64_t chunk;                       // tokens a chunk, > 0
  std::vector<at::Tensor> tensors;          // the head's trainable tensors, as the head reads them
  loom::nn::forward_conditions conditions;  // the generators (a LoRA adapter's dropout) and autocast
};

// The head and the cross-entropy summed over hidden states [tokens, hidden], chunk by chunk, as one
// autograd node: forward keeps the hidden states alone; backward computes each chunk's logits again
// with gradients on, through the model's own head (LoRA, soft-capping, a tied head), and
// differentiates them, so that at most one chunk's logits and their gradient are alive at a time.
struct chunked_head_loss : torch::autograd::Function<chunked_head_loss> {
  static at::Tensor forward(torch::autograd::AutogradContext* context,
                            const c10::intrusive_ptr<chunked_loss_state>& state, const at::Tensor& hidden,
                            at::TensorList /*tensors*/) {
    context->save_for_backward({hidden});
    context->saved_data["state"] = c10::IValue::make_capsule(state);
    at::Tensor total = at::zeros({}, hidden.options().dtype(at::kFloat));
    const std::int64_t tokens = hidden.size(0);
    for (std::int64_t begin = 0; begin < tokens; begin += state->chunk) {
      const std::int64_t size = std::min(state->chunk, tokens - begin);
      total.add_(state->loss(state->head(hidden.narrow(0, begin, size)), state->targets.narrow(0, begin, size)));
    }
    return total;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* context,
                                                 const torch::autograd::variable_list& grad_outputs) {
    const auto state = c10::static_intrusive_pointer_cast<chunked_loss_state>(context->saved_data["state"].toCapsule());
    const at::Tensor hidden = context->get_saved_variables().front();
    const std::size_t count = state->tensors.size();
    // One gradient a forward argument: none for the state, then the hidden states', then the head's.
    torch::autograd::variable_list grads(2 + count);
    // needs_input_grad counts the tensors alone: the hidden states, then the head's.
    const bool wants_hidden = context->needs_input_grad(0);
    std::vector<std::size_t> wanted;  // the head's tensors that need a gradient
    for (std::size_t i = 0; i < count; ++i) {
      if (context->needs_input_grad(1 + i)) wanted.push_back(i);
    }
    const at::Tensor& grad = grad_outputs.front();
    if (!grad.defined() || (!wants_hidden && wanted.empty())) return grads;
    at::Tensor hidden_grad = wants_hidden ? at::empty_like(hidden) : at::Tensor();
    // The head's gradients summed over the chunks in fp32, cast to each tensor's dtype at the end.
    std::vector<at::Tensor> sums(count);
    const std::int64_t tokens = hidden.size(0);
    state->conditions.replay([&] {
      for (std::int64_t begin = 0; begin < tokens; begin += state->chunk) {
        const std::int64_t size = std::min(state->chunk, tokens - begin);
        const at::Tensor part = hidden.narrow(0, begin, size).detach().requires_grad_(wants_hidden);
        const at::Tensor loss = state->loss(state->head(part), state->targets.narrow(0, begin, size));
        torch::autograd::variable_list targets;
        if (wants_hidden) targets.push_back(part);
        for (const std::size_t i : wanted) targets.push_back(state->tensors[i]);
        const torch::autograd::variable_list computed =
            torch::autograd::grad({loss}, targets, {grad}, /*retain_graph=*/false, /*create_graph=*/false,
                                  /*allow_unused=*/true);
        std::size_t next = 0;
        if (wants_hidden) {
          const at::Tensor& g = computed[next++];
          if (g.defined()) {
            hidden_grad.narrow(0, begin, size).copy_(g);
          } else {
            hidden_grad.narrow(0, begin, size).zero_();
          }
        }
        for (const std::size_t i : wanted) {
          const at::Tensor& g = computed[next++];
          if (!g.defined()) continue;
          if (!sums[i].defined()) {
            sums[i] = g.to(at::kFloat);
          } else {
            sums[i].add_(g);
          }
        }
      }
    });
    grads[1] = hidden_grad;
    for (const std::size_t i : wanted) {
      if (sums[i].defined()) grads[2 + i] = sums[i].to(state->tensors[i].scalar_type());
    }
    return grads;
  }
};

}  // namespace

DecoderRMSNormImpl::DecoderRMSNormImpl(std::int64_t size, double eps, norm_weighting weighting)
    : weight(register_parameter("weight", loom::nn::empty({size}))), eps_(eps), weighting_(weighting) {
  // The identity either way: Gemma's (1 + w) starts from zeros.
  const double identity = weighting == norm_weighting::scale ? 1 : 0;
  loom::nn::initialise(weight, {[identity](at::Tensor& w) { w.fill_(identity); }, /*draws=*/false});
}

at::Tensor DecoderRMSNormImpl::forward(const at::Tensor& x) {
  const at::Tensor wide = x.to(at::kFloat);
  const at::Tensor normed = wide * at::rsqrt(wide.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  if (weighting_ == norm_weighting::offset_scale) return (normed * (1 + weight.to(at::kFloat))).to(x.scalar_type());
  return weight * normed.to(x.scalar_type());
}

DecoderAttentionImpl::DecoderAttentionImpl(const causal_lm_config& config, std::int64_t layer)
    : q_proj(register_module(
          "q_proj", linear(config.hidden_size, config.num_attention_heads * config.head_dim, config.qkv_bias))),
      k_proj(register_module(
          "k_proj", linear(config.hidden_size, config.num_key_value_heads * config.head_dim, config.qkv_bias))),
      v_proj(register_module(
          "v_proj", linear(config.hidden_size, config.num_key_value_heads * config.head_dim, config.qkv_bias))),
      o_proj(register_module(
          "o_proj", linear(config.num_attention_heads * config.head_dim, config.hidden_size, config.output_bias))),
      attention(register_module(
          "attention",
          loom::nn::Attention(loom::nn::attention_options{
              .heads = config.num_attention_heads,
              .kv_heads = config.num_key_value_heads,
              .head_dim = config.head_dim,
              .causal = true,
              .scale = config.query_pre_attn_scalar
                           ? std::optional<double>(1 / std::sqrt(*config.query_pre_attn_scalar))
                           : std::nullopt,
              .sliding_window = config.attention_of(layer) == layer_attention::sliding ? config.sliding_window : 0}))),
      heads_(config.num_attention_heads),
      kv_heads_(config.num_key_value_heads),
      head_dim_(config.head_dim) {
  if (config.qk_norm) {
    q_norm = register_module("q_norm", DecoderRMSNorm(config.head_dim, config.rms_norm_eps, config.norm));
    k_norm = register_module("k_norm", DecoderRMSNorm(config.head_dim, config.rms_norm_eps, config.norm));
  }
}

DecoderAttentionImpl::projected DecoderAttentionImpl::project(const at::Tensor& x, const at::Tensor& cos,
                                                              const at::Tensor& sin) {
  const std::int64_t batch = x.size(0), seq = x.size(1);
  // As many heads as the projections give: under tensor_parallel this rank's slice of them.
  const auto heads_of = [&](const at::Tensor& y) { return y.view({batch, seq, -1, head_dim_}); };
  at::Tensor q = heads_of(q_proj(x));
  at::Tensor k = heads_of(k_proj(x));
  const at::Tensor v = heads_of(v_proj(x));
  if (q_norm) {
    q = q_norm(q);
    k = k_norm(k);
  }
  // [(batch,) seq, 1, head_dim]: the same angles for every head.
  const at::Tensor c = cos.to(q.scalar_type()).unsqueeze(-2);
  const at::Tensor s = sin.to(q.scalar_type()).unsqueeze(-2);
  return {q * c + rotate_half(q) * s, k * c + rotate_half(k) * s, v};
}

at::Tensor DecoderAttentionImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                         const std::optional<nn::packed_documents>& documents) {
  const auto [q, k, v] = project(x, cos, sin);
  return o_proj(attention(q, k, v, documents).flatten(2));
}

at::Tensor DecoderAttentionImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                         kv_cache::layer& cache) {
  const auto [q, k, v] = project(x, cos, sin);
  const std::int64_t cached = cache.keys.defined() ? cache.keys.size(1) : 0, seq = x.size(1);
  cache.keys = cached == 0 ? k : at::cat({cache.keys, k}, 1);
  cache.values = cached == 0 ? v : at::cat({cache.values, v}, 1);
  at::Tensor keys = cache.keys, values = cache.values;
  if (kv_heads_ != heads_) {
    keys = keys.repeat_interleave(heads_ / kv_heads_, 2);
    values = values.repeat_interleave(heads_ / kv_heads_, 2);
  }
  // New token i is at position cached + i and sees key j when j <= cached + i, and in a window when
  // also cached + i - j < sliding_window, as the uncached forward's mask says.
  const loom::nn::attention_options& options = attention->options();
  std::optional<at::Tensor> mask;
  if (seq > 1 || options.sliding_window > 0) {
    const auto longs = at::TensorOptions(at::kLong).device(x.device());
    const at::Tensor behind =
        (at::arange(cached, cached + seq, longs).unsqueeze(1) - at::arange(cached + seq, longs).unsqueeze(0));
    mask = options.sliding_window > 0 ? behind.ge(0).logical_and(behind.lt(options.sliding_window)) : behind.ge(0);
  }
  const at::Tensor attended = loom::scaled_dot_product_attention(q.transpose(1, 2), keys.transpose(1, 2),
                                                                 values.transpose(1, 2), mask, false, options.scale)
                                  .transpose(1, 2);
  return o_proj(attended.flatten(2));
}

DecoderMLPImpl::DecoderMLPImpl(const causal_lm_config& config)
    : gate_proj(register_module("gate_proj", linear(config.hidden_size, config.intermediate_size, config.mlp_bias))),
      up_proj(register_module("up_proj", linear(config.hidden_size, config.intermediate_size, config.mlp_bias))),
      down_proj(register_module("down_proj", linear(config.intermediate_size, config.hidden_size, config.mlp_bias))),
      activation_(config.activation) {}

at::Tensor DecoderMLPImpl::forward(const at::Tensor& x) {
  const at::Tensor gate = gate_proj(x);
  const at::Tensor activated = activation_ == mlp_activation::silu ? at::silu(gate) : at::gelu(gate, "tanh");
  return down_proj(activated * up_proj(x));
}

DecoderLayerImpl::DecoderLayerImpl(const causal_lm_config& config, std::int64_t layer)
    : self_attn(register_module("self_attn", DecoderAttention(config, layer))),
      mlp(register_module("mlp", DecoderMLP(config))),
      input_layernorm(
          register_module("input_layernorm", DecoderRMSNorm(config.hidden_size, config.rms_norm_eps, config.norm))),
      post_attention_layernorm(register_module("post_attention_layernorm",
                                               DecoderRMSNorm(config.hidden_size, config.rms_norm_eps, config.norm))),
      attention_kind_(config.attention_of(layer)) {
  if (config.sandwich_norms) {
    pre_feedforward_layernorm = register_module("pre_feedforward_layernorm",
                                                DecoderRMSNorm(config.hidden_size, config.rms_norm_eps, config.norm));
    post_feedforward_layernorm = register_module("post_feedforward_layernorm",
                                                 DecoderRMSNorm(config.hidden_size, config.rms_norm_eps, config.norm));
  }
}

template <class Attend>
at::Tensor DecoderLayerImpl::around_attention(const at::Tensor& x, Attend&& attend) {
  if (!pre_feedforward_layernorm) {
    const at::Tensor h = x + attend(input_layernorm(x));
    return h + mlp(post_attention_layernorm(h));
  }
  // Gemma's sandwich: each sublayer's output normed before it joins the residual.
  const at::Tensor h = x + post_attention_layernorm(attend(input_layernorm(x)));
  return h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)));
}

at::Tensor DecoderLayerImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                     const std::optional<nn::packed_documents>& documents) {
  return around_attention(x, [&](const at::Tensor& normed) { return self_attn->forward(normed, cos, sin, documents); });
}

at::Tensor DecoderLayerImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                     kv_cache::layer& cache) {
  return around_attention(x, [&](const at::Tensor& normed) { return self_attn->forward(normed, cos, sin, cache); });
}

DecoderModelImpl::DecoderModelImpl(const causal_lm_config& config)
    : embed_tokens(register_module(
          "embed_tokens",
          loom::nn::Embedding(torch::nn::EmbeddingOptions(config.vocab_size, config.hidden_size)
                                  .padding_idx(config.pad_token_id ? std::optional<std::int64_t>(*config.pad_token_id)
                                                                   : std::nullopt)))),
      layers(register_module("layers", torch::nn::ModuleList())),
      norm(register_module("norm", DecoderRMSNorm(config.hidden_size, config.rms_norm_eps, config.norm))),
      sequence(register_module("sequence", loom::nn::Sequence())),
      inv_freq_(inverse_frequencies(config.rope, config.head_dim)),
      sliding_inv_freq_(inverse_frequencies(config.sliding_rope, config.head_dim)),
      embedding_scale_(config.scaled_embeddings ? std::sqrt(static_cast<double>(config.hidden_size)) : 1) {
  for (std::int64_t i = 0; i < config.num_hidden_layers; ++i)
    layers->push_back(std::make_shared<DecoderLayer>(config, i));
}

DecoderModelImpl::rotary_tables DecoderModelImpl::rotary(const at::Tensor& positions) {
  if (inv_freq_.device() != positions.device()) {
    // Once, on the first forward on a device: every later forward reads them there.
    inv_freq_ = to_device(inv_freq_, positions.device(), at::kFloat);
    sliding_inv_freq_ = to_device(sliding_inv_freq_, positions.device(), at::kFloat);
  }
  const auto [cos, sin] = rotary_angles(positions, inv_freq_);
  const auto [sliding_cos, sliding_sin] = rotary_angles(positions, sliding_inv_freq_);
  return {cos, sin, sliding_cos, sliding_sin};
}

at::Tensor DecoderModelImpl::embed(const at::Tensor& ids) {
  const at::Tensor h = embed_tokens(ids);
  // Gemma rounds √hidden to the embeddings' dtype before it scales them.
  return embedding_scale_ != 1 ? h * at::scalar_tensor(embedding_scale_, h.options()) : h;
}

at::Tensor DecoderModelImpl::forward(const at::Tensor& ids) {
  // The split first: it agrees on the batch's shape across the group and names a length it cannot split.
  const at::Tensor mine = sequence->split(ids, 1);
  const loom::nn::token_range tokens = sequence->tokens(ids.size(1));
  return run_layers(mine, rotary(at::arange(tokens.begin, tokens.end, ids.options().dtype(at::kFloat))), std::nullopt);
}

at::Tensor DecoderModelImpl::forward(const at::Tensor& ids, const at::Tensor& positions) {
  if (positions.dim() != 2 || ids.dim() != 2 || positions.sizes() != ids.sizes() ||
      !at::isIntegralType(positions.scalar_type(), /*includeBool=*/false)) {
    throw_error<std::invalid_argument>(
        "CausalLM: positions {}[{}] for token ids [{}]: give each token's position in its document, integers "
        "[batch, seq] of the same tokens, 0 where a document starts, whole on every rank",
        c10::toString(positions.scalar_type()), fmt::join(positions.sizes(), ", "), fmt::join(ids.sizes(), ", "));
  }
  const at::Tensor mine = sequence->split(ids, 1);
  const at::Tensor whole = positions.to(ids.device());
  // A document is the run of tokens from one position 0 to the next.
  return run_layers(mine, rotary(sequence->local(whole, 1).to(at::kFloat)),
                    nn::packed_documents::from_positions(positions, ids.device()));
}

at::Tensor DecoderModelImpl::run_layers(const at::Tensor& mine, const rotary_tables& tables,
                                        const std::optional<nn::packed_documents>& documents) {
  at::Tensor h = embed(mine);
  for (const auto& layer : *layers) {
    auto& decoder_layer = *layer->as<DecoderLayer>();
    const bool sliding = decoder_layer.attention_kind() == layer_attention::sliding;
    h = decoder_layer.forward(h, sliding ? tables.sliding_cos : tables.cos, sliding ? tables.sliding_sin : tables.sin,
                              documents);
  }
  return norm(h);
}

at::Tensor DecoderModelImpl::forward(const at::Tensor& ids, kv_cache& cache) {
  if (cache.layers.empty()) cache.layers.resize(layers->size());
  if (cache.layers.size() != layers->size() || (cache.length > 0 && cache.layers.front().keys.size(0) != ids.size(0))) {
    throw_error<std::invalid_argument>(
        "CausalLM: a kv_cache of {} and {} for {} and a batch of {}: give each sequence batch a cache of its own, "
        "fresh for its first tokens",
        counted(static_cast<std::int64_t>(cache.layers.size()), "layer"), counted(cache.length, "token"),
        counted(static_cast<std::int64_t>(layers->size()), "layer"), ids.size(0));
  }
  const rotary_tables tables =
      rotary(at::arange(cache.length, cache.length + ids.size(1), ids.options().dtype(at::kFloat)));
  at::Tensor h = embed(ids);
  for (std::size_t i = 0; i < layers->size(); ++i) {
    auto& decoder_layer = *layers[i]->as<DecoderLayer>();
    const bool sliding = decoder_layer.attention_kind() == layer_attention::sliding;
    h = decoder_layer.forward(h, sliding ? tables.sliding_cos : tables.cos, sliding ? tables.sliding_sin : tables.sin,
                              cache.layers[i]);
  }
  cache.length += ids.size(1);
  return norm(h);
}

namespace {

// Tokens a chunk of the loss holds the logits of: their fp32 values near 64 MiB.
std::int64_t default_loss_chunk_tokens(std::int64_t vocab_size) {
  constexpr std::int64_t fp32_logits_bytes = std::int64_t{64} << 20;
  return std::max<std::int64_t>(1, fp32_logits_bytes / (4 * std::max<std::int64_t>(vocab_size, 1)));
}

}  // namespace

CausalLMImpl::CausalLMImpl(const causal_lm_config& config_)
    : config(config_),
      model(register_module("model", DecoderModel(config))),
      loss_chunk_tokens(default_loss_chunk_tokens(config.vocab_size)) {
  if (!config.tie_word_embeddings) {
    lm_head = register_module("lm_head", linear(config.hidden_size, config.vocab_size, false));
  }
}

std::vector<tied_parameter> CausalLMImpl::tied_parameters() const {
  if (!config.tie_word_embeddings) return {};
  return {{.name = "lm_head.weight", .reads = "model.embed_tokens.weight"}};
}

std::vector<loom::nn::parallel_layer> CausalLMImpl::tensor_parallel_plan() const {
  using loom::nn::parallel_style;
  std::vector<loom::nn::parallel_layer> plan{
      {"model.embed_tokens", parallel_style::vocab},
      {"model.layers.*.self_attn.q_proj", parallel_style::colwise},
      {"model.layers.*.self_attn.k_proj", parallel_style::colwise},
      {"model.layers.*.self_attn.v_proj", parallel_style::colwise},
      {"model.layers.*.self_attn.o_proj", parallel_style::rowwise},
      {"model.layers.*.mlp.gate_proj", parallel_style::colwise},
      {"model.layers.*.mlp.up_proj", parallel_style::colwise},
      {"model.layers.*.mlp.down_proj", parallel_style::rowwise},
  };
  if (config.qk_norm) {
    plan.push_back({"model.layers.*.self_attn.q_norm", parallel_style::gradient_summed});
    plan.push_back({"model.layers.*.self_attn.k_norm", parallel_style::gradient_summed});
  }
  if (lm_head) plan.push_back({"lm_head", parallel_style::colwise});
  return plan;
}

at::Tensor CausalLMImpl::logits_of(const at::Tensor& hidden) {
  at::Tensor logits;
  if (lm_head) {
    logits = lm_head(hidden);
  } else if (const auto& split = model->embed_tokens->split()) {
    // The tied head reads this rank's rows of the table: its input enters the split whole.
    logits = loom::linear(split->enter(hidden), model->embed_tokens->weight);
  } else {
    logits = loom::linear(hidden, model->embed_tokens->weight);
  }
  if (!config.final_logit_softcapping) return logits;
  const double cap = *config.final_logit_softcapping;
  return at::tanh(logits / cap) * cap;
}

at::Tensor CausalLMImpl::whole_logits_of(const at::Tensor& hidden) {
  const at::Tensor logits = logits_of(hidden);
  const auto& split = model->embed_tokens->split();
  return split ? split->gather(logits, -1) : logits;
}

at::Tensor CausalLMImpl::forward(const at::Tensor& ids) { return whole_logits_of(model->forward(ids)); }

std::vector<at::Tensor> CausalLMImpl::trainable_head_tensors() const {
  std::vector<at::Tensor> tensors;
  if (lm_head) {
    for (const at::Tensor& parameter : lm_head->parameters()) {
      if (parameter.requires_grad()) tensors.push_back(parameter);
    }
  } else if (model->embed_tokens->weight.requires_grad()) {
    tensors.push_back(model->embed_tokens->weight);
  }
  return tensors;
}

void CausalLMImpl::check_loss_arguments(const at::Tensor& ids, const at::Tensor& labels) const {
  if (labels.dim() != 2 || ids.dim() != 2 || labels.sizes() != ids.sizes()) {
    throw_error<std::invalid_argument>(
        "CausalLM: labels [{}] for token ids [{}]: give labels [batch, seq] of the same tokens, whole on every rank "
        "(-100 where a token is not predicted)",
        fmt::join(labels.sizes(), ", "), fmt::join(ids.sizes(), ", "));
  }
  if (loss_chunk_tokens < 0) {
    throw_error<std::invalid_argument>(
        "CausalLM: loss_chunk_tokens is {}: give the tokens whose logits the loss holds at a time, or 0 for all",
        loss_chunk_tokens);
  }
}

at::Tensor CausalLMImpl::forward(const at::Tensor& ids, const at::Tensor& labels) {
  check_loss_arguments(ids, labels);
  return loss_of(model->forward(ids), labels);
}

at::Tensor CausalLMImpl::forward(const at::Tensor& ids, const at::Tensor& labels, const at::Tensor& positions) {
  check_loss_arguments(ids, labels);
  const at::Tensor hidden = model->forward(ids, positions);
  // A document's first token is not the previous document's next one.
  return loss_of(hidden, labels.masked_fill(positions.to(labels.device()).eq(0), -100));
}

at::Tensor CausalLMImpl::loss_of(const at::Tensor& hidden, const at::Tensor& labels) {
  loom::nn::Sequence& sequence = model->sequence;
  // Position t predicts labels[t + 1]; the last position predicts nothing. Under sequence_parallel
  // the labels are shifted whole, then this rank's part is taken, as causal_lm_loss takes them.
  const at::Tensor whole_labels = labels.to(hidden.device());
  const at::Tensor shifted = at::cat(
      {whole_labels.narrow(1, 1, labels.size(1) - 1), at::full({labels.size(0), 1}, -100, whole_labels.options())}, 1);
  const at::Tensor targets = sequence->local(shifted, 1).flatten();
  const at::Tensor flat = hidden.flatten(0, 1);
  const std::int64_t tokens = flat.size(0);
  const std::int64_t chunk =
      loss_chunk_tokens > 0 && loss_chunk_tokens < tokens ? loss_chunk_tokens : std::max<std::int64_t>(tokens, 1);
  std::vector<at::Tensor> tensors = trainable_head_tensors();
  auto state = c10::make_intrusive<chunked_loss_state>([this](const at::Tensor& h) { return logits_of(h); },
                                                       model->embed_tokens->split().get(), targets, chunk, tensors,
                                                       loom::nn::forward_conditions({flat}));
  const at::Tensor summed = chunked_head_loss::apply(state, flat, at::TensorList(tensors));
  return sequence->sum(summed) / (shifted != -100).sum().to(at::kFloat);
}

at::Tensor CausalLMImpl::next_token_logits(const at::Tensor& ids, kv_cache& cache) {
  // The head over the last position alone: over a long prompt, a whole vocabulary's logits for every
  // token would outweigh the model.
  return whole_logits_of(model->forward(ids, cache).select(1, -1));
}

at::Tensor causal_lm_loss(const at::Tensor& logits, const at::Tensor& labels) {
  const std::int64_t seq = logits.size(1);
  if (labels.dim() != 2 || labels.size(1) != seq) {
    throw_error<std::invalid_argument>(
        "causal_lm_loss: logits of {} against labels [{}]: give labels [batch, seq] of the logits' tokens (under "
        "sequence_parallel the logits are this rank's part: pass the model's loom::nn::Sequence, "
        "causal_lm_loss(logits, labels, model->model->sequence))",
        counted(seq, "token"), fmt::join(labels.sizes(), ", "));
  }
  const at::Tensor predicted = logits.narrow(1, 0, seq - 1).to(at::kFloat).flatten(0, 1);
  const at::Tensor targets = labels.narrow(1, 1, seq - 1).flatten();
  return torch::nn::functional::cross_entropy(predicted, targets,
                                              torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100));
}

at::Tensor causal_lm_loss(const at::Tensor& logits, const at::Tensor& labels, loom::nn::Sequence& sequence) {
  if (sequence->size() == 1) return causal_lm_loss(logits, labels);
  // Position t predicts labels[t + 1]; the last position predicts nothing.
  const at::Tensor shifted =
      at::cat({labels.narrow(1, 1, labels.size(1) - 1), at::full({labels.size(0), 1}, -100, labels.options())}, 1);
  const at::Tensor targets = sequence->local(shifted, 1);
  if (targets.size(1) != logits.size(1)) {
    throw_error<std::invalid_argument>(
        "causal_lm_loss: logits of {} against {} of this rank's labels: give the logits of the model's forward on "
        "these labels' tokens",
        counted(logits.size(1), "token"), targets.size(1));
  }
  const at::Tensor summed = torch::nn::functional::cross_entropy(
      logits.to(at::kFloat).flatten(0, 1), targets.flatten(),
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100).reduction(torch::kSum));
  return sequence->sum(summed) / (shifted != -100).sum().to(at::kFloat);
}

}  // namespace loom::models

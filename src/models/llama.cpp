#include <loom/models/llama.hpp>

#include "config_json.hpp"

#include <loom/base/text.hpp>
#include <loom/nn/deferred_init.hpp>
#include <loom/precision/linear.hpp>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/functional/loss.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <numbers>
#include <stdexcept>

namespace loom::models {
namespace {

using json = nlohmann::json;

// transformers 5 writes rope_parameters {rope_type, rope_theta, ...}; earlier versions rope_theta
// and rope_scaling {rope_type or type, ...}.
void read_rope(const detail::config_json& read, llama_config& config) {
  const json* parameters = read.find("rope_parameters");
  const json* scaling = parameters ? parameters : read.find("rope_scaling");
  config.rope_theta = read.number(parameters ? *parameters : read.root(), "rope_theta", 10000);
  if (!scaling) return;
  if (!scaling->is_object())
    read.fail("'{}' is {}: give an object", parameters ? "rope_parameters" : "rope_scaling", scaling->dump());
  const json* type = read.find(*scaling, "rope_type");
  if (!type) type = read.find(*scaling, "type");
  const std::string kind = type && type->is_string() ? type->get<std::string>() : "default";
  if (kind == "default") return;
  if (kind != "llama3") {
    read.fail(
        "rope scaling of type '{}' is not supported: loom's Llama computes the default rotary embedding and "
        "llama3's",
        kind);
  }
  config.rope_scaling = llama3_rope_scaling{
      .factor = read.number(*scaling, "factor", 8),
      .low_freq_factor = read.number(*scaling, "low_freq_factor", 1),
      .high_freq_factor = read.number(*scaling, "high_freq_factor", 4),
      .original_max_position_embeddings = read.whole(*scaling, "original_max_position_embeddings", 8192)};
}

// The rotary embedding's inverse frequencies, as transformers' rope init functions compute them.
at::Tensor inverse_frequencies(const llama_config& config) {
  const auto options = at::TensorOptions(at::kFloat);
  at::Tensor inv_freq =
      1.0 / at::pow(config.rope_theta, at::arange(0, config.head_dim, 2, at::TensorOptions(at::kLong)).to(at::kFloat) /
                                           static_cast<double>(config.head_dim));
  if (!config.rope_scaling) return inv_freq.to(options);
  const llama3_rope_scaling& scaling = *config.rope_scaling;
  const auto old_context = static_cast<double>(scaling.original_max_position_embeddings);
  const double low_freq_wavelen = old_context / scaling.low_freq_factor;
  const double high_freq_wavelen = old_context / scaling.high_freq_factor;
  const at::Tensor wavelen = 2 * std::numbers::pi / inv_freq;
  at::Tensor scaled = at::where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq);
  const at::Tensor smooth =
      (old_context / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor);
  const at::Tensor smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled;
  const at::Tensor medium = (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
  return at::where(medium, smoothed, scaled).to(options);
}

at::Tensor rotate_half(const at::Tensor& x) {
  const std::int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

}  // namespace

llama_config llama_config::from_pretrained(const std::filesystem::path& path) {
  const auto [file, text] =
      detail::read_config_text(path, "Llama", "give a checkpoint folder holding config.json, or the file");
  return from_json(text, file);
}

llama_config llama_config::from_json(std::string_view text, const std::string& source) {
  const detail::config_json read(text, "Llama", source, "give the config.json of a checkpoint");
  const json& root = read.root();
  if (const json* architectures = read.find(root, "architectures")) {
    const bool llama =
        architectures->is_array() && std::any_of(architectures->begin(), architectures->end(), [](const json& a) {
          return a.is_string() && (a == "LlamaForCausalLM" || a == "LlamaModel");
        });
    if (!llama)
      read.fail("'architectures' is {}: loom::models::Llama reads LlamaForCausalLM checkpoints", architectures->dump());
  } else if (const json* type = read.find(root, "model_type"); type && *type != "llama") {
    read.fail("'model_type' is {}: loom::models::Llama reads model_type \"llama\"", type->dump());
  }
  llama_config config;
  config.vocab_size = read.whole(root, "vocab_size", std::nullopt);
  config.hidden_size = read.whole(root, "hidden_size", std::nullopt);
  config.intermediate_size = read.whole(root, "intermediate_size", std::nullopt);
  config.num_hidden_layers = read.whole(root, "num_hidden_layers", std::nullopt);
  config.num_attention_heads = read.whole(root, "num_attention_heads", std::nullopt);
  config.num_key_value_heads = read.whole(root, "num_key_value_heads", config.num_attention_heads);
  if (!read.find(root, "head_dim") && config.hidden_size % config.num_attention_heads != 0) {
    read.fail("num_attention_heads = {} does not divide hidden_size = {}: give head_dim, or heads that divide it",
              config.num_attention_heads, config.hidden_size);
  }
  config.head_dim = read.whole(root, "head_dim", config.hidden_size / config.num_attention_heads);
  if (config.head_dim % 2 != 0) read.fail("head_dim = {} is odd: the rotary embedding rotates pairs", config.head_dim);
  if (config.num_attention_heads % config.num_key_value_heads != 0) {
    read.fail(
        "num_key_value_heads = {} does not divide num_attention_heads = {}: each key-value head serves a whole "
        "group of query heads",
        config.num_key_value_heads, config.num_attention_heads);
  }
  config.max_position_embeddings = read.whole(root, "max_position_embeddings", config.max_position_embeddings);
  config.rms_norm_eps = read.number(root, "rms_norm_eps", config.rms_norm_eps);
  read_rope(read, config);
  config.attention_bias = read.flag("attention_bias", false);
  config.mlp_bias = read.flag("mlp_bias", false);
  config.tie_word_embeddings = read.flag("tie_word_embeddings", false);
  if (const json* act = read.find(root, "hidden_act"); act && *act != "silu") {
    read.fail("'hidden_act' is {}: Llama's MLP is SwiGLU, silu", act->dump());
  }
  return config;
}

LlamaRMSNormImpl::LlamaRMSNormImpl(std::int64_t size, double eps)
    : weight(register_parameter("weight", loom::nn::empty({size}))), eps_(eps) {
  loom::nn::initialise(weight, {[](at::Tensor& w) { w.fill_(1); }, /*draws=*/false});
}

at::Tensor LlamaRMSNormImpl::forward(const at::Tensor& x) {
  const at::Tensor wide = x.to(at::kFloat);
  const at::Tensor normed = wide * at::rsqrt(wide.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  return weight * normed.to(x.scalar_type());
}

LlamaAttentionImpl::LlamaAttentionImpl(const llama_config& config)
    : q_proj(register_module(
          "q_proj",
          loom::nn::Linear(torch::nn::LinearOptions(config.hidden_size, config.num_attention_heads * config.head_dim)
                               .bias(config.attention_bias)))),
      k_proj(register_module(
          "k_proj",
          loom::nn::Linear(torch::nn::LinearOptions(config.hidden_size, config.num_key_value_heads * config.head_dim)
                               .bias(config.attention_bias)))),
      v_proj(register_module(
          "v_proj",
          loom::nn::Linear(torch::nn::LinearOptions(config.hidden_size, config.num_key_value_heads * config.head_dim)
                               .bias(config.attention_bias)))),
      o_proj(register_module(
          "o_proj",
          loom::nn::Linear(torch::nn::LinearOptions(config.num_attention_heads * config.head_dim, config.hidden_size)
                               .bias(config.attention_bias)))),
      attention(register_module("attention",
                                loom::nn::Attention(loom::nn::attention_options{.heads = config.num_attention_heads,
                                                                                .kv_heads = config.num_key_value_heads,
                                                                                .head_dim = config.head_dim,
                                                                                .causal = true,
                                                                                .scale = std::nullopt}))),
      heads_(config.num_attention_heads),
      kv_heads_(config.num_key_value_heads),
      head_dim_(config.head_dim) {}

at::Tensor LlamaAttentionImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const std::int64_t batch = x.size(0), seq = x.size(1);
  const auto heads_of = [&](const at::Tensor& y, std::int64_t count) { return y.view({batch, seq, count, head_dim_}); };
  const at::Tensor q = heads_of(q_proj(x), heads_);
  const at::Tensor k = heads_of(k_proj(x), kv_heads_);
  const at::Tensor v = heads_of(v_proj(x), kv_heads_);
  // [seq, 1, head_dim]: the same angles for every head.
  const at::Tensor c = cos.to(q.scalar_type()).unsqueeze(1);
  const at::Tensor s = sin.to(q.scalar_type()).unsqueeze(1);
  const at::Tensor attended = attention(q * c + rotate_half(q) * s, k * c + rotate_half(k) * s, v);
  return o_proj(attended.reshape({batch, seq, heads_ * head_dim_}));
}

LlamaMLPImpl::LlamaMLPImpl(const llama_config& config)
    : gate_proj(register_module(
          "gate_proj",
          loom::nn::Linear(
              torch::nn::LinearOptions(config.hidden_size, config.intermediate_size).bias(config.mlp_bias)))),
      up_proj(register_module(
          "up_proj",
          loom::nn::Linear(
              torch::nn::LinearOptions(config.hidden_size, config.intermediate_size).bias(config.mlp_bias)))),
      down_proj(register_module(
          "down_proj",
          loom::nn::Linear(
              torch::nn::LinearOptions(config.intermediate_size, config.hidden_size).bias(config.mlp_bias)))) {}

at::Tensor LlamaMLPImpl::forward(const at::Tensor& x) { return down_proj(at::silu(gate_proj(x)) * up_proj(x)); }

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const llama_config& config)
    : self_attn(register_module("self_attn", LlamaAttention(config))),
      mlp(register_module("mlp", LlamaMLP(config))),
      input_layernorm(register_module("input_layernorm", LlamaRMSNorm(config.hidden_size, config.rms_norm_eps))),
      post_attention_layernorm(
          register_module("post_attention_layernorm", LlamaRMSNorm(config.hidden_size, config.rms_norm_eps))) {}

at::Tensor LlamaDecoderLayerImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const at::Tensor h = x + self_attn(input_layernorm(x), cos, sin);
  return h + mlp(post_attention_layernorm(h));
}

LlamaModelImpl::LlamaModelImpl(const llama_config& config)
    : embed_tokens(register_module("embed_tokens", loom::nn::Embedding(config.vocab_size, config.hidden_size))),
      layers(register_module("layers", torch::nn::ModuleList())),
      norm(register_module("norm", LlamaRMSNorm(config.hidden_size, config.rms_norm_eps))),
      sequence(register_module("sequence", loom::nn::Sequence())),
      inv_freq_(inverse_frequencies(config)) {
  for (std::int64_t i = 0; i < config.num_hidden_layers; ++i)
    layers->push_back(std::make_shared<LlamaDecoderLayer>(config));
}

at::Tensor LlamaModelImpl::forward(const at::Tensor& ids) {
  const at::Tensor mine = sequence->split(ids, 1);
  const loom::nn::token_range tokens = sequence->tokens(ids.size(1));
  // In fp32 whatever the model computes in, as transformers computes them with autocast off.
  const at::Tensor positions = at::arange(tokens.begin, tokens.end, ids.options().dtype(at::kFloat));
  const at::Tensor freqs = at::outer(positions, inv_freq_.to(ids.device()));
  const at::Tensor angles = at::cat({freqs, freqs}, -1);
  const at::Tensor cos = angles.cos();
  const at::Tensor sin = angles.sin();
  at::Tensor h = embed_tokens(mine);
  for (const auto& layer : *layers) h = layer->as<LlamaDecoderLayer>()->forward(h, cos, sin);
  return norm(h);
}

LlamaImpl::LlamaImpl(const llama_config& config_)
    : config(config_), model(register_module("model", LlamaModel(config))) {
  if (!config.tie_word_embeddings) {
    lm_head = register_module(
        "lm_head", loom::nn::Linear(torch::nn::LinearOptions(config.hidden_size, config.vocab_size).bias(false)));
  }
}

at::Tensor LlamaImpl::forward(const at::Tensor& ids) {
  const at::Tensor hidden = model(ids);
  return lm_head ? lm_head(hidden) : loom::linear(hidden, model->embed_tokens->weight);
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

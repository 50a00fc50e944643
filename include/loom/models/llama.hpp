#pragma once
// loom::models::Llama: the Llama architecture as transformers' LlamaForCausalLM defines it, with its
// module and parameter names (model.embed_tokens, model.layers.<i>.self_attn.q_proj, ..., model.norm,
// lm_head), so that a Hugging Face checkpoint loads by name (job.load_weights) and LoRA targets and
// PEFT adapters line up with no renaming. Each decoder layer is a loom::nn::Unit: a unit of sharding
// under fsdp() and of recompute(...). docs/models.md.
//
//   const auto config = loom::models::llama_config::from_pretrained("checkpoint/");
//   auto job = loom::build(loom::model<loom::models::Llama>(config) | loom::fsdp(), rt);
//   job.load_weights("checkpoint/");
//   const at::Tensor logits = job.forward(ids);  // int64 [batch, seq] -> [batch, seq, vocab]

#include <loom/nn/embedding.hpp>
#include <loom/nn/linear.hpp>
#include <loom/nn/sequence_parallel.hpp>
#include <loom/nn/unit.hpp>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace loom::models {

// rope_scaling of type llama3 (Llama 3.1 and later): long wavelengths slowed by `factor`, short
// ones kept, those between blended.
struct llama3_rope_scaling {
  double factor = 8;
  double low_freq_factor = 1;
  double high_freq_factor = 4;
  std::int64_t original_max_position_embeddings = 8192;
};

// config.json's keys, under transformers' names and defaults (LlamaConfig).
struct llama_config {
  std::int64_t vocab_size = 32000;
  std::int64_t hidden_size = 4096;
  std::int64_t intermediate_size = 11008;
  std::int64_t num_hidden_layers = 32;
  std::int64_t num_attention_heads = 32;
  std::int64_t num_key_value_heads = 32;
  std::int64_t head_dim = 128;  // hidden_size / num_attention_heads unless config.json says
  std::int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000;
  std::optional<llama3_rope_scaling> rope_scaling;
  bool attention_bias = false;
  bool mlp_bias = false;
  bool tie_word_embeddings = false;

  // Reads `folder`/config.json (or a config.json path). Throws std::invalid_argument in one sentence
  // naming the file and the key: another architecture, a missing key, a value of the wrong type, heads
  // that do not divide the hidden size, key-value heads that do not divide the heads, an activation
  // or rope scaling other than silu and llama3.
  [[nodiscard]] static llama_config from_pretrained(const std::filesystem::path& path);
  // The same from config.json's text; `source` names it in the messages.
  [[nodiscard]] static llama_config from_json(std::string_view text, const std::string& source);
};

// x / rms(x) · weight, computed in fp32 and returned in x's dtype (LlamaRMSNorm).
class LlamaRMSNormImpl : public torch::nn::Module {
 public:
  LlamaRMSNormImpl(std::int64_t size, double eps);
  at::Tensor forward(const at::Tensor& x);

  at::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(LlamaRMSNorm);

class LlamaAttentionImpl : public torch::nn::Module {
 public:
  explicit LlamaAttentionImpl(const llama_config& config);
  // Causal self-attention over x [batch, seq, hidden], rotary embedding cos and sin [seq, head_dim]
  // of the same tokens (this rank's, under sequence_parallel).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

  loom::nn::Linear q_proj, k_proj, v_proj, o_proj;
  loom::nn::Attention attention;  // no weights: where sequence_parallel exchanges the sequence for heads

 private:
  std::int64_t heads_, kv_heads_, head_dim_;
};
TORCH_MODULE(LlamaAttention);

// down(silu(gate(x)) · up(x)).
class LlamaMLPImpl : public torch::nn::Module {
 public:
  explicit LlamaMLPImpl(const llama_config& config);
  at::Tensor forward(const at::Tensor& x);

  loom::nn::Linear gate_proj, up_proj, down_proj;
};
TORCH_MODULE(LlamaMLP);

class LlamaDecoderLayerImpl : public torch::nn::Module {
 public:
  explicit LlamaDecoderLayerImpl(const llama_config& config);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

  LlamaAttention self_attn;
  LlamaMLP mlp;
  LlamaRMSNorm input_layernorm, post_attention_layernorm;
};
using LlamaDecoderLayer = loom::nn::Unit<LlamaDecoderLayerImpl>;

// The decoder: embeddings, the layers, the final norm (transformers' LlamaModel, named `model`).
class LlamaModelImpl : public torch::nn::Module {
 public:
  explicit LlamaModelImpl(const llama_config& config);
  // The final hidden states [batch, seq, hidden] of token ids [batch, seq].
  at::Tensor forward(const at::Tensor& ids);

  loom::nn::Embedding embed_tokens;
  torch::nn::ModuleList layers;
  LlamaRMSNorm norm;
  loom::nn::Sequence sequence;  // no weights: where sequence_parallel splits the tokens

 private:
  // The rotary embedding's inverse frequencies, fp32 [head_dim / 2]: computed, not a weight (as
  // transformers' non-persistent inv_freq buffer), so it is in no state_dict.
  at::Tensor inv_freq_;
};
TORCH_MODULE(LlamaModel);

// LlamaForCausalLM: the decoder and the head. A tied head (tie_word_embeddings) reads the embedding
// matrix and has no weight of its own, as a checkpoint of it has no lm_head.weight.
class LlamaImpl : public torch::nn::Module {
 public:
  // What a saved adapter tells PEFT, so that AutoPeftModelForCausalLM loads it with its base model.
  static constexpr std::string_view peft_task_type = "CAUSAL_LM";

  explicit LlamaImpl(const llama_config& config);
  // Logits [batch, seq, vocab] of token ids [batch, seq] (int64).
  at::Tensor forward(const at::Tensor& ids);

  llama_config config;
  LlamaModel model;
  loom::nn::Linear lm_head{nullptr};  // none when tied
};
TORCH_MODULE(Llama);

// The mean next-token cross-entropy of `logits` [batch, seq, vocab] against `labels` [batch, seq]
// (int64), computed in fp32: position t predicts labels[t + 1]; labels of -100 are left out, as
// transformers' causal-LM loss leaves them.
[[nodiscard]] at::Tensor causal_lm_loss(const at::Tensor& logits, const at::Tensor& labels);
// The same under sequence_parallel: `logits` of this rank's tokens, `labels` [batch, seq] whole on
// every rank, shifted before they are split; the per-token losses summed over the group and divided
// by the sequence's labelled tokens, so that loss and gradients are the unsplit run's. `sequence` is
// the model's (Llama's model->sequence); without the stage this is the loss above.
[[nodiscard]] at::Tensor causal_lm_loss(const at::Tensor& logits, const at::Tensor& labels,
                                        loom::nn::Sequence& sequence);

}  // namespace loom::models

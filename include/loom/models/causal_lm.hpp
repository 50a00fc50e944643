#pragma once
// loom::models::CausalLM: the decoder-only language models of transformers' Llama, Mistral, Qwen2,
// Qwen3 and Gemma 3 families (causal_lm_config.hpp says where they differ), with transformers'
// module and parameter names (model.embed_tokens, model.layers.<i>.self_attn.q_proj, ...,
// model.norm, lm_head), so that a Hugging Face checkpoint loads by name (pretrained(...)) and LoRA
// targets and PEFT adapters line up with no renaming. Each decoder layer is a loom::nn::Unit: a unit
// of sharding under fsdp() and of recompute(...). docs/models.md.
//
//   const auto config = loom::models::causal_lm_config::from_pretrained("Qwen3-0.6B/");
//   auto job = loom::build(loom::model<loom::models::CausalLM>(config) | loom::pretrained("Qwen3-0.6B/") |
//                          loom::fsdp(), rt);
//   const at::Tensor logits = job.forward(ids);  // int64 [batch, seq] -> [batch, seq, vocab]
//   const at::Tensor loss = job.forward(ids, labels);  // the mean next-token loss, without the logits

#include <loom/lora/lora.hpp>
#include <loom/models/causal_lm_config.hpp>
#include <loom/nn/embedding.hpp>
#include <loom/nn/linear.hpp>
#include <loom/nn/sequence_parallel.hpp>
#include <loom/nn/tensor_parallel.hpp>
#include <loom/nn/unit.hpp>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <string_view>
#include <vector>

namespace loom::models {

// The keys and values a CausalLM has computed for the tokens it has read, each layer's, so that a
// forward of the next tokens computes their positions alone (loom::models::generate, generate.hpp),
// as transformers' DynamicCache holds them. Every layer keeps every token (a sliding-window layer
// masks the older ones rather than dropping them), with its key-value heads unrepeated.
struct kv_cache {
  struct layer {
    at::Tensor keys, values;  // [batch, tokens, kv_heads, head_dim]; undefined before the first forward
  };
  std::vector<layer> layers;  // one a decoder layer, made by the first forward
  std::int64_t length = 0;    // the tokens read: the position of the next one
};

// x / rms(x), computed in fp32, weighted as `weighting` says (causal_lm_config::norm).
class DecoderRMSNormImpl : public torch::nn::Module {
 public:
  DecoderRMSNormImpl(std::int64_t size, double eps, norm_weighting weighting);
  at::Tensor forward(const at::Tensor& x);

  at::Tensor weight;

 private:
  double eps_;
  norm_weighting weighting_;
};
TORCH_MODULE(DecoderRMSNorm);

class DecoderAttentionImpl : public torch::nn::Module {
 public:
  DecoderAttentionImpl(const causal_lm_config& config, std::int64_t layer);
  // Causal self-attention over x [batch, seq, hidden], rotary embedding cos and sin [seq, head_dim]
  // (or [batch, seq, head_dim]) of the same tokens (this rank's, under sequence_parallel); with
  // `documents` (loom::nn::Attention's), each token attends within its document only.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     const std::optional<nn::packed_documents>& documents = std::nullopt);
  // The same for new tokens x that follow the cached ones (cos and sin of their positions): their keys
  // and values join `cache`, and each query attends to the cached keys and the new ones up to itself.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, kv_cache::layer& cache);

  loom::nn::Linear q_proj, k_proj, v_proj, o_proj;
  DecoderRMSNorm q_norm{nullptr}, k_norm{nullptr};  // qk_norm's, over each head
  loom::nn::Attention attention;  // no weights: where sequence_parallel exchanges the sequence for heads

 private:
  struct projected {
    at::Tensor q, k, v;  // [batch, seq, heads or kv_heads, head_dim], q and k normed and turned
  };
  projected project(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

  std::int64_t heads_, kv_heads_, head_dim_;
};
TORCH_MODULE(DecoderAttention);

// down(act(gate(x)) · up(x)).
class DecoderMLPImpl : public torch::nn::Module {
 public:
  explicit DecoderMLPImpl(const causal_lm_config& config);
  at::Tensor forward(const at::Tensor& x);

  loom::nn::Linear gate_proj, up_proj, down_proj;

 private:
  mlp_activation activation_;
};
TORCH_MODULE(DecoderMLP);

class DecoderLayerImpl : public torch::nn::Module {
 public:
  DecoderLayerImpl(const causal_lm_config& config, std::int64_t layer);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     const std::optional<nn::packed_documents>& documents = std::nullopt);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, kv_cache::layer& cache);

  [[nodiscard]] layer_attention attention_kind() const noexcept { return attention_kind_; }

  DecoderAttention self_attn;
  DecoderMLP mlp;
  DecoderRMSNorm input_layernorm, post_attention_layernorm;
  DecoderRMSNorm pre_feedforward_layernorm{nullptr}, post_feedforward_layernorm{nullptr};  // sandwich_norms'

 private:
  template <class Attend>
  at::Tensor around_attention(const at::Tensor& x, Attend&& attend);

  layer_attention attention_kind_;
};
using DecoderLayer = loom::nn::Unit<DecoderLayerImpl>;

// The decoder: embeddings, the layers, the final norm (transformers' <Family>Model, named `model`).
class DecoderModelImpl : public torch::nn::Module {
 public:
  explicit DecoderModelImpl(const causal_lm_config& config);
  // The final hidden states [batch, seq, hidden] of token ids [batch, seq].
  at::Tensor forward(const at::Tensor& ids);
  // Those of a packed batch: `positions` [batch, seq] (int64, whole on every rank) restart at 0 where
  // a document starts, as transformers' position_ids of a padding-free batch; each token's rotary
  // angle is its position in its document, and it attends within its document only.
  at::Tensor forward(const at::Tensor& ids, const at::Tensor& positions);
  // Those of ids [batch, new] that follow the `cache`'s tokens, which they join.
  at::Tensor forward(const at::Tensor& ids, kv_cache& cache);

  loom::nn::Embedding embed_tokens;
  torch::nn::ModuleList layers;
  DecoderRMSNorm norm;
  loom::nn::Sequence sequence;  // no weights: where sequence_parallel splits the tokens

 private:
  // The rotary tables of `positions`, fp32 [tokens, head_dim] (or [batch, tokens, head_dim] of
  // [batch, tokens] positions): full-attention layers' and sliding ones'.
  struct rotary_tables {
    at::Tensor cos, sin, sliding_cos, sliding_sin;
  };
  rotary_tables rotary(const at::Tensor& positions);
  at::Tensor embed(const at::Tensor& ids);
  // The layers and the final norm over `mine`, this rank's tokens (Sequence::split's).
  at::Tensor run_layers(const at::Tensor& mine, const rotary_tables& tables,
                        const std::optional<nn::packed_documents>& documents);

  // The rotary embeddings' inverse frequencies, fp32 [head_dim / 2], of full-attention layers and of
  // sliding ones: computed, not weights (as transformers' non-persistent inv_freq buffers), so they
  // are in no state_dict; on the device of the last forward's tokens.
  at::Tensor inv_freq_, sliding_inv_freq_;
  double embedding_scale_;
};
TORCH_MODULE(DecoderModel);

// <Family>ForCausalLM: the decoder and the head. A tied head (tie_word_embeddings) reads the embedding
// matrix and has no weight of its own, as a checkpoint of it has no lm_head.weight.
class CausalLMImpl : public torch::nn::Module {
 public:
  // What a saved adapter tells PEFT, so that AutoPeftModelForCausalLM loads it with its base model.
  static constexpr std::string_view peft_task_type = "CAUSAL_LM";
  // The head, which lora(r, {loom::all_linear}) leaves out, as PEFT's "all-linear" does (none when tied).
  static constexpr std::string_view output_embeddings = "lm_head";

  explicit CausalLMImpl(const causal_lm_config& config);
  // With tie_word_embeddings, the head's weight that it reads from the embedding rather than holds.
  [[nodiscard]] std::vector<tied_parameter> tied_parameters() const;
  // Its layers under tensor_parallel (loom/nn/tensor_parallel.hpp), as transformers' base_model_tp_plan
  // marks them: attention's q, k, v colwise by heads and o rowwise, the MLP's gate and up colwise and
  // down rowwise, the embedding and the head by vocabulary (the loss computed over the split logits),
  // and the per-head q and k norms' weights gradient_summed.
  [[nodiscard]] std::vector<loom::nn::parallel_layer> tensor_parallel_plan() const;
  // Logits [batch, seq, vocab] of token ids [batch, seq] (int64); under tensor_parallel gathered
  // whole on every rank (forward(ids, labels) never gathers them).
  at::Tensor forward(const at::Tensor& ids);
  // The mean next-token cross-entropy of token ids [batch, seq] against `labels` [batch, seq] (int64;
  // position t predicts labels[t + 1], labels of -100 left out), as transformers'
  // model(input_ids, labels=labels).loss: causal_lm_loss(forward(ids), labels, model->sequence), equal
  // within fp32 rounding, without ever holding the logits of every token. The head and the fp32
  // cross-entropy run over loss_chunk_tokens tokens at a time in forward, keeping only the final hidden
  // states, and again chunk by chunk in backward (torchtune's chunked loss, Liger's fused linear
  // cross-entropy), as one autograd node whose inputs are the hidden states and the head's trainable
  // tensors (lm_head's weight or its LoRA adapter, or the tied embedding). Under sequence_parallel,
  // `labels` are whole on every rank and the loss is the group's, as causal_lm_loss's. Called through
  // job.forward(ids, labels), so that a sharding strategy holds the head whole for both passes.
  at::Tensor forward(const at::Tensor& ids, const at::Tensor& labels);
  // The same loss over a packed batch: `positions` [batch, seq] (int64) restart at 0 where a document
  // starts (transformers' position_ids with DataCollatorWithFlattening, padding_free): each document
  // attends within itself and turns by its own positions, and its last token does not predict the next
  // document's first. Equal, within fp32 rounding, to the documents' losses computed one by one and
  // weighted by their labelled tokens.
  at::Tensor forward(const at::Tensor& ids, const at::Tensor& labels, const at::Tensor& positions);
  // The logits [batch, vocab] of the token after ids [batch, new], which follow the `cache`'s tokens
  // (none in a fresh cache) and join it: a prompt, then each generated token, computes its positions
  // alone. loom::models::generate (generate.hpp) calls it without gradients, in eval mode.
  at::Tensor next_token_logits(const at::Tensor& ids, kv_cache& cache);

  causal_lm_config config;
  DecoderModel model;
  loom::nn::Linear lm_head{nullptr};  // none when tied
  // The tokens whose logits forward(ids, labels) holds at a time; 0: every token's at once. A chunk's
  // logits in the compute dtype and in fp32 take 6 bytes a token and a vocabulary entry, doubled in
  // backward by their gradient. The default keeps a chunk's fp32 logits near 64 MiB whatever the
  // vocabulary (110 tokens of Qwen3's 151936, 4096 of a 4096-entry one): torchtune splits the tokens
  // into 8 chunks whatever their count (CEWithChunkedOutputLoss's num_output_chunks = 8), and Liger
  // sizes a chunk's logits like the hidden states (next_power_of_2(tokens / ceil(vocab / hidden)),
  // LigerFusedLinearCrossEntropyFunction), whose few-token chunks read the whole head once each: on a
  // CPU that costs more than the memory it saves.
  std::int64_t loss_chunk_tokens;

 private:
  // This rank's logits: under tensor_parallel its slice of the vocabulary.
  at::Tensor logits_of(const at::Tensor& hidden);
  // The logits whole on every rank.
  at::Tensor whole_logits_of(const at::Tensor& hidden);
  // Throws std::invalid_argument, naming the fix, for labels of other tokens than `ids`.
  void check_loss_arguments(const at::Tensor& ids, const at::Tensor& labels) const;
  // The loss of forward(ids, labels) from the final hidden states.
  at::Tensor loss_of(const at::Tensor& hidden, const at::Tensor& labels);
  // What the head computes with and trains: lm_head's parameters, or the tied embedding, that require grad.
  [[nodiscard]] std::vector<at::Tensor> trainable_head_tensors() const;
};
TORCH_MODULE(CausalLM);

// The mean next-token cross-entropy of `logits` [batch, seq, vocab] against `labels` [batch, seq]
// (int64), computed in fp32: position t predicts labels[t + 1]; labels of -100 are left out, as
// transformers' causal-LM loss leaves them. It casts every token's logits to fp32 at once: for
// training, CausalLM's forward(ids, labels) computes the same loss over chunks of tokens, never
// holding them (job.forward(ids, labels)).
[[nodiscard]] at::Tensor causal_lm_loss(const at::Tensor& logits, const at::Tensor& labels);
// The same under sequence_parallel: `logits` of this rank's tokens, `labels` [batch, seq] whole on
// every rank, shifted before they are split; the per-token losses summed over the group and divided
// by the sequence's labelled tokens, so that loss and gradients are the unsplit run's. `sequence` is
// the model's (model->sequence); without the stage this is the loss above.
[[nodiscard]] at::Tensor causal_lm_loss(const at::Tensor& logits, const at::Tensor& labels,
                                        loom::nn::Sequence& sequence);

}  // namespace loom::models

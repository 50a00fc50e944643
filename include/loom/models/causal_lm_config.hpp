#pragma once
// What loom::models::CausalLM builds: the decoder-only language models of transformers' Llama,
// Mistral, Qwen2 (and Qwen2.5), Qwen3 and Gemma 3 (text) families, as one set of settings. The
// families share one decoder (embeddings, layers of attention and a gated MLP, a final norm, a head)
// and differ where transformers' modular_*.py files say they do, each difference a field below:
//
//   Llama    optional biases; llama3 rope scaling
//   Mistral  Llama with every layer's attention in a sliding window (sliding_window)
//   Qwen2    biases on q, k and v but not o; a sliding window on the layers its config names
//   Qwen3    Qwen2 without the biases, with an RMSNorm per head on q and k
//   Gemma 3  (1 + w) norms, norms after attention and MLP too, embeddings scaled by √hidden, GELU-tanh,
//            q and k norms, sliding-window and global layers with a rotary base each,
//            query_pre_attn_scalar, final logit soft-capping, tied embeddings
//
// docs/models.md. causal_lm_config::from_pretrained reads any of them from config.json.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom::models {

enum class causal_lm_family : std::uint8_t { llama, mistral, qwen2, qwen3, gemma3 };

// "Llama", "Mistral", "Qwen2", "Qwen3", "Gemma3".
[[nodiscard]] std::string_view to_string(causal_lm_family family) noexcept;
// Its class in transformers: "LlamaForCausalLM", ..., "Gemma3ForCausalLM".
[[nodiscard]] std::string_view architecture_of(causal_lm_family family) noexcept;

// One rotary embedding: its base, and its scaling (transformers' rope_type): none, linear (positions
// slowed by `factor`, as Gemma 3's global layers), or llama3 (long wavelengths slowed by `factor`,
// short ones kept, those between blended).
struct rope_parameters {
  enum class scaling : std::uint8_t { none, linear, llama3 };

  double theta = 10000;
  scaling type = scaling::none;
  double factor = 1;
  double low_freq_factor = 1;                            // llama3
  double high_freq_factor = 4;                           // llama3
  std::int64_t original_max_position_embeddings = 8192;  // llama3
};

// How a layer attends: to every earlier token, or to the last sliding_window of them (itself included).
enum class layer_attention : std::uint8_t { full, sliding };

// How an RMSNorm applies its weight: w · x rounded to x's dtype first (Llama, Qwen, Mistral), or
// x · (1 + w) computed in fp32 and then rounded (Gemma, whose weights start at zero).
enum class norm_weighting : std::uint8_t { scale, offset_scale };

enum class mlp_activation : std::uint8_t { silu, gelu_tanh };

// config.json's keys under transformers' names; the defaults are LlamaConfig's. for_family gives
// another family's structure.
struct causal_lm_config {
  causal_lm_family family = causal_lm_family::llama;

  std::int64_t vocab_size = 32000;
  std::int64_t hidden_size = 4096;
  std::int64_t intermediate_size = 11008;
  std::int64_t num_hidden_layers = 32;
  std::int64_t num_attention_heads = 32;
  std::int64_t num_key_value_heads = 32;
  std::int64_t head_dim = 128;  // hidden_size / num_attention_heads unless config.json says
  std::int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  std::optional<std::int64_t> pad_token_id;  // its embedding row gets no gradient, as nn.Embedding's padding_idx

  rope_parameters rope;          // full-attention layers (every layer, but Gemma 3's sliding ones)
  rope_parameters sliding_rope;  // Gemma 3's sliding-window layers (rope_local_base_freq)

  // One per layer; empty: every layer full. sliding_window: the tokens a sliding layer sees.
  std::vector<layer_attention> layer_types;
  std::int64_t sliding_window = 0;

  bool qkv_bias = false;     // q_proj, k_proj, v_proj (Llama's and Qwen3's attention_bias; Qwen2: always)
  bool output_bias = false;  // o_proj (attention_bias; Qwen2: never)
  bool mlp_bias = false;
  bool qk_norm = false;         // an RMSNorm over each head of q and of k, before the rotary embedding
  bool sandwich_norms = false;  // Gemma: norms after attention and the MLP, and before the MLP
  norm_weighting norm = norm_weighting::scale;
  mlp_activation activation = mlp_activation::silu;
  bool scaled_embeddings = false;                 // Gemma: embeddings · √hidden_size (rounded to their dtype)
  std::optional<double> query_pre_attn_scalar;    // attention scale 1 / √this; none: 1 / √head_dim
  std::optional<double> final_logit_softcapping;  // logits = cap · tanh(logits / cap)

  // `family`'s structure (biases, norms, activation, embedding scale, tied head) with LlamaConfig's
  // sizes.
  [[nodiscard]] static causal_lm_config for_family(causal_lm_family family);

  // Reads `folder`/config.json (or a config.json path) of any family above, from its `architectures`
  // or else its `model_type`. Throws std::invalid_argument in one sentence naming the file and the
  // key: another architecture, a missing key, a value of the wrong type, heads that do not divide the
  // hidden size, key-value heads that do not divide the heads, an activation or rope scaling the
  // family does not have, a setting loom does not build (Gemma 3's bidirectional attention).
  [[nodiscard]] static causal_lm_config from_pretrained(const std::filesystem::path& path);
  // The same from config.json's text; `source` names it in the messages.
  [[nodiscard]] static causal_lm_config from_json(std::string_view text, const std::string& source);

  [[nodiscard]] layer_attention attention_of(std::int64_t layer) const;
};

}  // namespace loom::models

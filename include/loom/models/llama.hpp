#pragma once
// loom 0.1.0's Llama, kept deprecated through 0.2.0 so that a program written against it still
// compiles and builds the same model: loom::models::Llama is now loom::models::CausalLM
// (loom/models/causal_lm.hpp), which builds Llama and four more families from a causal_lm_config.
// Every name below warns with its new one; they go in loom 0.3.0, with this header (docs/changes.md).

#pragma GCC warning "loom/models/llama.hpp is deprecated: include <loom/models/causal_lm.hpp>; it goes in loom 0.3.0"

#include <loom/base/text.hpp>
#include <loom/models/causal_lm.hpp>
#include <loom/models/causal_lm_config.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace loom::models {

using Llama [[deprecated("use loom::models::CausalLM (loom/models/causal_lm.hpp); Llama goes in loom 0.3.0")]] =
    CausalLM;
using LlamaImpl [[deprecated("use loom::models::CausalLMImpl; LlamaImpl goes in loom 0.3.0")]] = CausalLMImpl;
using LlamaModel [[deprecated("use loom::models::DecoderModel; LlamaModel goes in loom 0.3.0")]] = DecoderModel;
using LlamaModelImpl [[deprecated("use loom::models::DecoderModelImpl; LlamaModelImpl goes in loom 0.3.0")]] =
    DecoderModelImpl;
using LlamaDecoderLayer [[deprecated("use loom::models::DecoderLayer; LlamaDecoderLayer goes in loom 0.3.0")]] =
    DecoderLayer;
using LlamaDecoderLayerImpl
    [[deprecated("use loom::models::DecoderLayerImpl; LlamaDecoderLayerImpl goes in loom 0.3.0")]] = DecoderLayerImpl;
using LlamaAttention [[deprecated("use loom::models::DecoderAttention; LlamaAttention goes in loom 0.3.0")]] =
    DecoderAttention;
using LlamaAttentionImpl
    [[deprecated("use loom::models::DecoderAttentionImpl; LlamaAttentionImpl goes in loom 0.3.0")]] =
        DecoderAttentionImpl;
using LlamaMLP [[deprecated("use loom::models::DecoderMLP; LlamaMLP goes in loom 0.3.0")]] = DecoderMLP;
using LlamaMLPImpl [[deprecated("use loom::models::DecoderMLPImpl; LlamaMLPImpl goes in loom 0.3.0")]] = DecoderMLPImpl;
using LlamaRMSNorm [[deprecated("use loom::models::DecoderRMSNorm; LlamaRMSNorm goes in loom 0.3.0")]] = DecoderRMSNorm;
using LlamaRMSNormImpl [[deprecated("use loom::models::DecoderRMSNormImpl; LlamaRMSNormImpl goes in loom 0.3.0")]] =
    DecoderRMSNormImpl;

// rope_scaling of type llama3, as 0.1.0 held it.
struct [[deprecated(
    "use loom::models::rope_parameters (causal_lm_config::rope, its type scaling::llama3); llama3_rope_scaling goes "
    "in loom 0.3.0")]] llama3_rope_scaling {
  double factor = 8;
  double low_freq_factor = 1;
  double high_freq_factor = 4;
  std::int64_t original_max_position_embeddings = 8192;
};

// The warnings are for the user's uses of these names, not for the deprecated struct below naming its
// deprecated parts.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

// 0.1.0's settings of a Llama, its fields in their order, under their names then: what they are in a
// causal_lm_config is what the conversion below makes of them.
struct [[deprecated(
    "use loom::models::causal_lm_config (loom/models/causal_lm_config.hpp): rope_theta is its rope.theta, "
    "rope_scaling its rope, attention_bias its qkv_bias and output_bias; llama_config goes in loom "
    "0.3.0")]] llama_config {
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

  // Reads `folder`/config.json (or a config.json path) as causal_lm_config does, and refuses, as 0.1.0
  // did, a checkpoint of another family or a rope scaling other than llama3's, which these fields
  // cannot hold.
  [[nodiscard]] static llama_config from_pretrained(const std::filesystem::path& path) {
    return of_llama(causal_lm_config::from_pretrained(path), path.string());
  }
  // The same from config.json's text; `source` names it in the messages.
  [[nodiscard]] static llama_config from_json(std::string_view text, const std::string& source) {
    return of_llama(causal_lm_config::from_json(text, source), source);
  }

  // What CausalLM's constructor takes: so `Llama(config)` and `model<Llama>(config)` build 0.1.0's model.
  operator causal_lm_config() const {  // NOLINT(google-explicit-constructor): 0.1.0's callers pass it as is
    causal_lm_config config = causal_lm_config::for_family(causal_lm_family::llama);
    config.vocab_size = vocab_size;
    config.hidden_size = hidden_size;
    config.intermediate_size = intermediate_size;
    config.num_hidden_layers = num_hidden_layers;
    config.num_attention_heads = num_attention_heads;
    config.num_key_value_heads = num_key_value_heads;
    config.head_dim = head_dim;
    config.max_position_embeddings = max_position_embeddings;
    config.rms_norm_eps = rms_norm_eps;
    config.rope.theta = rope_theta;
    if (rope_scaling) {
      config.rope.type = rope_parameters::scaling::llama3;
      config.rope.factor = rope_scaling->factor;
      config.rope.low_freq_factor = rope_scaling->low_freq_factor;
      config.rope.high_freq_factor = rope_scaling->high_freq_factor;
      config.rope.original_max_position_embeddings = rope_scaling->original_max_position_embeddings;
    }
    config.qkv_bias = config.output_bias = attention_bias;
    config.mlp_bias = mlp_bias;
    config.tie_word_embeddings = tie_word_embeddings;
    return config;
  }

 private:
  // pad_token_id, which 0.1.0 did not read, is left out as it was.
  [[nodiscard]] static llama_config of_llama(const causal_lm_config& read, const std::string& source) {
    if (read.family != causal_lm_family::llama) {
      throw_error<std::invalid_argument>(
          "'{}' is a {} checkpoint: loom::models::llama_config reads Llama's; read it with "
          "loom::models::causal_lm_config::from_pretrained",
          source, to_string(read.family));
    }
    if (read.rope.type == rope_parameters::scaling::linear) {
      throw_error<std::invalid_argument>(
          "'{}' has rope scaling of type linear: loom::models::llama_config holds llama3's only; read it with "
          "loom::models::causal_lm_config::from_pretrained",
          source);
    }
    llama_config config;
    config.vocab_size = read.vocab_size;
    config.hidden_size = read.hidden_size;
    config.intermediate_size = read.intermediate_size;
    config.num_hidden_layers = read.num_hidden_layers;
    config.num_attention_heads = read.num_attention_heads;
    config.num_key_value_heads = read.num_key_value_heads;
    config.head_dim = read.head_dim;
    config.max_position_embeddings = read.max_position_embeddings;
    config.rms_norm_eps = read.rms_norm_eps;
    config.rope_theta = read.rope.theta;
    if (read.rope.type == rope_parameters::scaling::llama3) {
      config.rope_scaling =
          llama3_rope_scaling{.factor = read.rope.factor,
                              .low_freq_factor = read.rope.low_freq_factor,
                              .high_freq_factor = read.rope.high_freq_factor,
                              .original_max_position_embeddings = read.rope.original_max_position_embeddings};
    }
    config.attention_bias = read.qkv_bias;
    config.mlp_bias = read.mlp_bias;
    config.tie_word_embeddings = read.tie_word_embeddings;
    return config;
  }
};

#pragma GCC diagnostic pop

}  // namespace loom::models

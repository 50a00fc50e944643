#pragma once
// The real models at sizes a test trains in seconds on the CPU: a Llama whose 6 query heads 1, 2 and
// 3 ranks of sequence parallelism divide, one that tensor_parallel splits, and a Wan of 2 blocks.

#include <loom/job/job.hpp>
#include <loom/models/causal_lm.hpp>
#include <loom/models/wan.hpp>

#include <type_traits>

namespace loom::testing {

inline models::causal_lm_config small_llama() {
  models::causal_lm_config config;
  config.vocab_size = 64;
  config.hidden_size = 24;
  config.intermediate_size = 20;
  config.num_hidden_layers = 2;
  config.num_attention_heads = 6;
  config.num_key_value_heads = 2;
  config.head_dim = 4;
  return config;
}

// A Llama whose 4 query heads, vocabulary of 64 and MLP of 24 tensor_parallel 2 and 4 divide, with
// `key_value_heads` 2 (grouped: 4 does not divide them) or 4.
inline models::causal_lm_config split_llama(int key_value_heads) {
  models::causal_lm_config config;
  config.vocab_size = 64;
  config.hidden_size = 32;
  config.intermediate_size = 24;
  config.num_hidden_layers = 2;
  config.num_attention_heads = 4;
  config.num_key_value_heads = key_value_heads;
  config.head_dim = 8;
  return config;
}

// `family`'s structure at the sizes of `sizes`: for Gemma 3 (q and k norms, sandwich norms, scaled
// embeddings, GELU, soft-capping), its 3 layers local, global, local, in a window of 5 tokens, shorter
// than the tests' sequences.
inline models::causal_lm_config small_family(models::causal_lm_family family, const models::causal_lm_config& sizes) {
  models::causal_lm_config config = models::causal_lm_config::for_family(family);
  config.vocab_size = sizes.vocab_size;
  config.hidden_size = sizes.hidden_size;
  config.intermediate_size = sizes.intermediate_size;
  config.num_hidden_layers = sizes.num_hidden_layers;
  config.num_attention_heads = sizes.num_attention_heads;
  config.num_key_value_heads = sizes.num_key_value_heads;
  config.head_dim = sizes.head_dim;
  if (family == models::causal_lm_family::gemma3) {
    config.num_hidden_layers = 3;
    config.layer_types = {models::layer_attention::sliding, models::layer_attention::full,
                          models::layer_attention::sliding};
    config.sliding_window = 5;
    config.query_pre_attn_scalar = 10;
    config.final_logit_softcapping = 8;
  }
  return config;
}

inline models::wan_config small_wan() {
  models::wan_config config;
  config.num_attention_heads = 2;
  config.attention_head_dim = 12;
  config.in_channels = 4;
  config.out_channels = 4;
  config.text_dim = 16;
  config.freq_dim = 16;
  config.ffn_dim = 24;
  config.num_layers = 2;
  config.rope_max_seq_len = 32;
  return config;
}

// The CausalLM a job holds, in either model form (a TORCH_MODULE holder or a Module subclass).
template <class Job>
auto& causal_lm(Job& job) {
  if constexpr (loom::detail::module_holder<std::remove_cvref_t<decltype(job.module())>>) {
    return *job.module();
  } else {
    return job.module();
  }
}

}  // namespace loom::testing

#pragma once
// The real models at sizes a test trains in seconds on the CPU: a Llama whose 6 query heads 1, 2 and
// 3 ranks of sequence parallelism divide, and a Wan of 2 blocks.

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

#pragma once
// loom::models::generate: text from a CausalLM, one token at a time, as transformers' generate
// decodes it: greedily, or sampled through temperature, top-k and top-p; stopping at an end token;
// each new token one position's forward over a kv_cache. docs/models.md, "Generating text".
//
//   const at::Tensor ids = torch::tensor(std::vector<std::int64_t>{1, 15043, 29892}, torch::kLong);
//   const at::Tensor text = job.with_whole_module([&](loom::models::CausalLM& model) {
//     return loom::models::generate(model, ids, {.max_new_tokens = 64, .eos_token_id = {2}});
//   });  // the prompt, then up to 64 new tokens
//
// Under fsdp() every rank calls it inside with_whole_module (which gathers the parameters); under
// local() and ddp() that is the plain call, so the same line serves every strategy.

#include <loom/dsl/options.hpp>
#include <loom/models/causal_lm.hpp>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

namespace loom::models {

// transformers' GenerationConfig's names and defaults.
struct generation_options {
  std::int64_t max_new_tokens = 20;
  bool do_sample = false;  // false: the most likely token each step (greedy)
  // do_sample's: the logits divided by temperature, then the top_k most likely tokens kept (0: all),
  // then the fewest whose probabilities sum past top_p (1: all), as transformers' warpers apply them.
  double temperature = 1;
  std::int64_t top_k = 50;
  double top_p = 1;
  // A sequence that produces one of these stops; the others go on, it is filled with pad_token_id.
  // Empty: max_new_tokens each. Take them from the checkpoint's generation_config.json.
  std::vector<std::int64_t> eos_token_id{};
  std::optional<std::int64_t> pad_token_id{};  // none: the config's, else eos_token_id's first
  std::uint64_t seed = 0;                      // do_sample's draws: the same seed, the same tokens
  bool use_cache = true;  // false: the whole sequence again each step (transformers' use_cache=False)

  static constexpr auto fields() {
    return std::tuple{option_field{"max_new_tokens", &generation_options::max_new_tokens},
                      option_field{"do_sample", &generation_options::do_sample},
                      option_field{"temperature", &generation_options::temperature},
                      option_field{"top_k", &generation_options::top_k},
                      option_field{"top_p", &generation_options::top_p},
                      option_field{"eos_token_id", &generation_options::eos_token_id},
                      option_field{"pad_token_id", &generation_options::pad_token_id},
                      option_field{"seed", &generation_options::seed},
                      option_field{"use_cache", &generation_options::use_cache}};
  }
};

// `prompt` (int64 token ids [seq], or [batch, seq] of prompts of one length, no padding) followed by
// up to max_new_tokens: [batch, seq + new] ([seq + new] for a 1-D prompt), on the model's device.
// Runs without gradients and in eval mode (LoRA's dropout off), the model's mode put back after; in
// the parameters' dtype (mixed_precision's autocast is job.forward's). Throws std::invalid_argument
// in one sentence for an option out of range, a prompt of another shape or type, a token outside
// the vocabulary, and a prompt and max_new_tokens longer than max_position_embeddings.
[[nodiscard]] at::Tensor generate(CausalLM& model, const at::Tensor& prompt, const generation_options& options = {});

// The distribution do_sample draws the next token from, of fp32 logits [batch, vocab]: after
// temperature, top_k and top_p, softmax; fp32 [batch, vocab], zero outside the tokens kept.
[[nodiscard]] at::Tensor next_token_probabilities(const at::Tensor& logits, const generation_options& options);

}  // namespace loom::models

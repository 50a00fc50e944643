#include <loom/models/generate.hpp>

#include <loom/base/text.hpp>
#include <loom/runtime/host_reads.hpp>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <limits>
#include <stdexcept>

namespace loom::models {
namespace {

void check_token(std::int64_t id, std::string_view what, std::int64_t vocab) {
  if (id < 0 || id >= vocab) {
    throw_error<std::invalid_argument>("generate: {} {} is outside the vocabulary: give an id in [0, {})", what, id,
                                       vocab);
  }
}

void check_sampling(const generation_options& options) {
  if (!(options.temperature > 0) || !std::isfinite(options.temperature)) {
    throw_error<std::invalid_argument>(
        "generate: temperature = {} with do_sample: give a temperature above 0 (or do_sample = false for the most "
        "likely token each step)",
        options.temperature);
  }
  if (!(options.top_p > 0 && options.top_p <= 1)) {
    throw_error<std::invalid_argument>(
        "generate: top_p = {} is outside (0, 1]: give a probability above 0 (1 keeps "
        "every token)",
        options.top_p);
  }
  if (options.top_k < 0) {
    throw_error<std::invalid_argument>("generate: top_k = {} is negative: give 0 (every token) or more", options.top_k);
  }
}

// The prompt as [batch, seq], checked against the model and the options.
at::Tensor checked_prompt(const causal_lm_config& config, int sequence_split_size, const at::Tensor& prompt,
                          const generation_options& options) {
  if (!prompt.defined() || prompt.scalar_type() != at::kLong || prompt.dim() < 1 || prompt.dim() > 2 ||
      prompt.numel() == 0) {
    throw_error<std::invalid_argument>(
        "generate: a prompt of {} [{}]: give token ids as an int64 tensor [seq], or [batch, seq] of prompts of one "
        "length",
        prompt.defined() ? std::string(c10::toString(prompt.scalar_type())) : "no tensor",
        prompt.defined() ? fmt::format("{}", fmt::join(prompt.sizes(), ", ")) : "");
  }
  if (options.max_new_tokens < 1) {
    throw_error<std::invalid_argument>("generate: max_new_tokens = {}: give at least 1", options.max_new_tokens);
  }
  const at::Tensor rows = prompt.dim() == 1 ? prompt.unsqueeze(0) : prompt;
  const std::int64_t length = rows.size(1);
  if (length + options.max_new_tokens > config.max_position_embeddings) {
    throw_error<std::invalid_argument>(
        "generate: a prompt of {} and max_new_tokens = {} run past the model's max_position_embeddings = {}: give a "
        "shorter prompt or fewer new tokens (at most {})",
        counted(length, "token"), options.max_new_tokens, config.max_position_embeddings,
        std::max<std::int64_t>(config.max_position_embeddings - length, 0));
  }
  const at::Tensor extremes = read_on_host_uncounted(at::stack({rows.min(), rows.max()}));
  check_token(host_value<std::int64_t>(extremes[0]), "the prompt's token", config.vocab_size);
  check_token(host_value<std::int64_t>(extremes[1]), "the prompt's token", config.vocab_size);
  for (const std::int64_t eos : options.eos_token_id) check_token(eos, "eos_token_id", config.vocab_size);
  if (options.do_sample) check_sampling(options);
  if (!options.use_cache && sequence_split_size > 1) {
    throw_error<std::invalid_argument>(
        "generate: use_cache = false under sequence_parallel({}): the model's own forward splits the sequence "
        "across its group; leave use_cache on (the cached forward reads the whole sequence on each rank)",
        sequence_split_size);
  }
  return rows;
}

// The model in eval mode for the length of a generation (LoRA's dropout off), its mode put back after.
class eval_mode {
 public:
  explicit eval_mode(torch::nn::Module& model) : model_(model), was_training_(model.is_training()) { model_.eval(); }
  ~eval_mode() { model_.train(was_training_); }
  eval_mode(const eval_mode&) = delete;
  eval_mode& operator=(const eval_mode&) = delete;

 private:
  torch::nn::Module& model_;
  bool was_training_;
};

}  // namespace

at::Tensor next_token_probabilities(const at::Tensor& logits, const generation_options& options) {
  check_sampling(options);
  constexpr float removed = -std::numeric_limits<float>::infinity();
  at::Tensor scores = logits.to(at::kFloat) / options.temperature;
  if (options.top_k > 0 && options.top_k < scores.size(-1)) {
    const at::Tensor kth = std::get<0>(scores.topk(options.top_k, -1)).narrow(-1, options.top_k - 1, 1);
    scores = scores.masked_fill(scores < kth, removed);
  }
  if (options.top_p < 1) {
    // transformers' TopPLogitsWarper: in ascending order, the tokens whose cumulative probability is
    // at most 1 - top_p go; the most likely always stays.
    const auto [sorted, order] = scores.sort(-1, /*descending=*/false);
    at::Tensor sorted_removed = sorted.softmax(-1).cumsum(-1) <= 1 - options.top_p;
    sorted_removed.select(-1, -1).fill_(false);
    scores = scores.masked_fill(sorted_removed.scatter(-1, order, sorted_removed), removed);
  }
  return scores.softmax(-1);
}

at::Tensor generate(CausalLM& model, const at::Tensor& prompt, const generation_options& options) {
  CausalLMImpl& lm = *model;
  const at::Tensor rows = checked_prompt(lm.config, lm.model->sequence->size(), prompt, options);
  // What a sequence that has stopped is filled with, as transformers takes it: the option, the
  // config's, else the first end token.
  const std::int64_t pad = options.pad_token_id.value_or(
      lm.config.pad_token_id.value_or(options.eos_token_id.empty() ? 0 : options.eos_token_id.front()));
  check_token(pad, "pad_token_id", lm.config.vocab_size);

  const c10::NoGradGuard no_gradients;
  const eval_mode eval(lm);
  const c10::Device device = lm.model->embed_tokens->weight.device();
  at::Tensor ids = to_device(rows, device, at::kLong);
  const at::Tensor eos = to_device(at::tensor(options.eos_token_id, at::kLong), device, at::kLong);
  at::Tensor unfinished = at::ones({ids.size(0)}, at::TensorOptions(at::kBool).device(device));
  auto draws = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  kv_cache cache;
  at::Tensor logits = options.use_cache ? lm.next_token_logits(ids, cache) : lm.forward(ids).select(1, -1);
  for (std::int64_t step = 1;; ++step) {
    at::Tensor next;
    if (options.do_sample) {
      // Drawn on the host from one generator, so that the same seed gives the same tokens on any
      // device and on every rank.
      const at::Tensor probabilities = read_on_host_uncounted(next_token_probabilities(logits, options));
      next = to_device(at::multinomial(probabilities, 1, false, draws).squeeze(1), device, at::kLong);
    } else {
      next = logits.to(at::kFloat).argmax(-1);
    }
    if (eos.numel() > 0) next = at::where(unfinished, next, pad);
    ids = at::cat({ids, next.unsqueeze(1)}, 1);
    if (eos.numel() > 0) {
      unfinished = unfinished.logical_and(at::isin(next, eos).logical_not());
      if (!host_value<bool>(read_on_host_uncounted(unfinished.any()))) break;
    }
    if (step == options.max_new_tokens) break;
    logits = options.use_cache ? lm.next_token_logits(next.unsqueeze(1), cache) : lm.forward(ids).select(1, -1);
  }
  return prompt.dim() == 1 ? ids.squeeze(0) : ids;
}

}  // namespace loom::models

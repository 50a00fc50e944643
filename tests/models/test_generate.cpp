// loom::models::generate without transformers (generate_vs_transformers.py holds its tokens to
// transformers'): the kv_cache's logits against the whole sequence's forward, token by token and in
// chunks, in each family's structure (grouped-query heads, sliding windows shorter than the
// sequence, Gemma 3's two rotary bases); greedy decoding with the cache and without; the sampling
// distribution against transformers' warpers on fixed logits; the same seed, the same tokens; end
// tokens; the model's mode put back; and each refusal's sentence.
#include <loom/loom.hpp>
#include <loom/models/causal_lm.hpp>
#include <loom/models/generate.hpp>

#include <torch/torch.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cstdint>
#include <string>
#include <vector>

using Catch::Matchers::ContainsSubstring;
using loom::models::causal_lm_config;
using loom::models::causal_lm_family;
using loom::models::generation_options;
using loom::models::layer_attention;

namespace {

// `family`'s structure at a test's size: 3 layers, 4 heads over 2 key-value heads, and for those
// with a window (Mistral on every layer, Qwen3 and Gemma 3 on the outer ones) a window of 4 tokens,
// shorter than the sequences below.
causal_lm_config small(causal_lm_family family) {
  causal_lm_config config = causal_lm_config::for_family(family);
  config.vocab_size = 61;
  config.hidden_size = 32;
  config.intermediate_size = 48;
  config.num_hidden_layers = 3;
  config.num_attention_heads = 4;
  config.num_key_value_heads = 2;
  config.head_dim = 8;
  config.max_position_embeddings = 40;
  config.rope.theta = 500;
  if (family == causal_lm_family::gemma3) {
    config.query_pre_attn_scalar = 12;
    config.final_logit_softcapping = 5;
    config.sliding_rope.theta = 50;
  }
  if (family != causal_lm_family::llama) {
    config.sliding_window = 4;
    config.layer_types = family == causal_lm_family::mistral
                             ? std::vector<layer_attention>(3, layer_attention::sliding)
                             : std::vector{layer_attention::sliding, layer_attention::full, layer_attention::sliding};
  }
  return config;
}

// A random model whose every layer moves the logits (the default init leaves them near uniform).
loom::models::CausalLM random_model(const causal_lm_config& config) {
  torch::manual_seed(3);
  loom::models::CausalLM model(config);
  torch::NoGradGuard no_grad;
  for (auto& parameter : model->parameters()) parameter.normal_(0, 0.3);
  return model;
}

double largest_difference(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

std::string refused(loom::models::CausalLM& model, const at::Tensor& prompt, const generation_options& options) {
  try {
    (void)loom::models::generate(model, prompt, options);
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  return "(not refused)";
}

}  // namespace

TEST_CASE("the cache's logits are the whole sequence's, token by token and in chunks", "[generate]") {
  const causal_lm_family family = GENERATE(causal_lm_family::llama, causal_lm_family::mistral, causal_lm_family::qwen2,
                                           causal_lm_family::qwen3, causal_lm_family::gemma3);
  CAPTURE(loom::models::to_string(family));
  auto model = random_model(small(family));
  torch::NoGradGuard no_grad;
  const at::Tensor ids = torch::randint(0, 61, {2, 14}, torch::kLong);
  const at::Tensor whole = model->forward(ids);
  const double tolerance = 1e-5 * whole.abs().max().item<double>();
  // A prompt of 5, then chunks of 3 and 1 token (a chunk's queries see each other causally, and the
  // window reaches back into the cache), then one token a step.
  loom::models::kv_cache cache;
  std::int64_t read = 0;
  for (const std::int64_t chunk : {5, 3, 1, 1, 1, 1, 1, 1}) {
    const at::Tensor logits = model->next_token_logits(ids.narrow(1, read, chunk), cache);
    read += chunk;
    CHECK(cache.length == read);
    CHECK(largest_difference(logits, whole.select(1, read - 1)) <= tolerance);
  }
  CHECK(cache.layers.size() == 3);
  CHECK(cache.layers[0].keys.sizes() == at::IntArrayRef({2, 14, 2, 8}));  // the key-value heads, unrepeated
}

TEST_CASE("greedy decoding with the cache gives the tokens of decoding without it", "[generate]") {
  const causal_lm_family family = GENERATE(causal_lm_family::llama, causal_lm_family::qwen3, causal_lm_family::gemma3);
  CAPTURE(loom::models::to_string(family));
  auto model = random_model(small(family));
  const at::Tensor prompt = torch::randint(0, 61, {2, 6}, torch::kLong);
  const at::Tensor cached = loom::models::generate(model, prompt, {.max_new_tokens = 24});
  const at::Tensor recomputed = loom::models::generate(model, prompt, {.max_new_tokens = 24, .use_cache = false});
  REQUIRE(cached.sizes() == at::IntArrayRef({2, 30}));
  CHECK(cached.narrow(1, 0, 6).equal(prompt));
  CHECK(cached.equal(recomputed));
  // Each token the most likely after those before it.
  const at::Tensor logits = model->forward(cached.narrow(1, 0, 29));
  CHECK(logits.narrow(1, 5, 24).argmax(-1).equal(cached.narrow(1, 6, 24)));
  // Not one token over and over, which a model that ignored its cache could give.
  CHECK(std::get<0>(at::_unique(cached.narrow(1, 6, 24))).numel() >= 3);
  // A 1-D prompt gives a 1-D sequence: the first row's.
  CHECK(loom::models::generate(model, prompt[0], {.max_new_tokens = 24}).equal(cached[0]));
}

TEST_CASE("the sampling distribution is transformers' warpers' on fixed logits", "[generate][sampling]") {
  const at::Tensor logits = torch::tensor({{1.5, -0.25, 3.0, 0.5, 2.25, -1.0, 0.0, 1.0},  //
                                           {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 4.0}},
                                          torch::kFloat);
  // TemperatureLogitsWarper, TopKLogitsWarper and TopPLogitsWarper of transformers 5.25, in
  // generate's order, then softmax; the zeros are the tokens they remove.
  const auto check = [&](const generation_options& options, const std::vector<double>& first,
                         const std::vector<double>& second) {
    CAPTURE(options.temperature, options.top_k, options.top_p);
    const at::Tensor ours = loom::models::next_token_probabilities(logits, options);
    const at::Tensor theirs = torch::stack({torch::tensor(first, torch::kFloat), torch::tensor(second, torch::kFloat)});
    CHECK(ours.eq(0).equal(theirs.eq(0)));  // the kept set
    CHECK(largest_difference(ours, theirs) <= 1e-7);
  };
  check(
      {.temperature = 0.7, .top_k = 0},
      {0.0746267736, 0.00612573884, 0.636100411, 0.0178843867, 0.217876449, 0.00209818059, 0.00875515118, 0.0365329199},
      {0.0036496534, 0.00421011215, 0.00485663954, 0.00560244918, 0.00646278914, 0.00745524699, 0.00860011112,
       0.959162951});
  check({.top_k = 0, .top_p = 0.8}, {0.131601647, 0, 0.589797616, 0, 0.278600663, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 1});
  check({.temperature = 0.7, .top_k = 5, .top_p = 0.9}, {0.0803645104, 0, 0.685007453, 0, 0.234628037, 0, 0, 0},
        {0, 0, 0, 0, 0, 0, 0, 1});
  // A top_p below the likeliest token's probability keeps that token alone.
  check({.top_k = 0, .top_p = 0.01}, {0, 0, 1, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 1});
  check({.temperature = 2, .top_k = 0, .top_p = 0.6}, {0.218723074, 0, 0.463036746, 0, 0.318240196, 0, 0, 0},
        {0, 0, 0, 0, 0, 0.132886499, 0.139699742, 0.727413714});
}

TEST_CASE("sampling: the same seed gives the same tokens, another seed others", "[generate][sampling]") {
  auto model = random_model(small(causal_lm_family::qwen3));
  const at::Tensor prompt = torch::randint(0, 61, {2, 5}, torch::kLong);
  const generation_options options{
      .max_new_tokens = 20, .do_sample = true, .temperature = 1.5, .top_p = 0.95, .seed = 11};
  const at::Tensor first = loom::models::generate(model, prompt, options);
  CHECK(loom::models::generate(model, prompt, options).equal(first));
  // Drawn from the same distribution whether the cache holds the prefix or it is computed again.
  CHECK(
      loom::models::generate(
          model, prompt,
          {.max_new_tokens = 20, .do_sample = true, .temperature = 1.5, .top_p = 0.95, .seed = 11, .use_cache = false})
          .equal(first));
  generation_options other = options;
  other.seed = 12;
  CHECK_FALSE(loom::models::generate(model, prompt, other).equal(first));
  // The greedy tokens are not what a hot distribution samples.
  CHECK_FALSE(loom::models::generate(model, prompt, {.max_new_tokens = 20}).equal(first));
}

TEST_CASE("a sequence stops at an end token and is padded while the others go on", "[generate]") {
  auto model = random_model(small(causal_lm_family::llama));
  const at::Tensor prompt = torch::randint(0, 61, {2, 4}, torch::kLong);
  const at::Tensor free = loom::models::generate(model, prompt, {.max_new_tokens = 16});
  // The second row's fourth new token as the end token: that row stops there, the first where it makes
  // it (if it does).
  const std::int64_t eos = free[1][7].item<std::int64_t>();
  const at::Tensor generated_first = free[0].narrow(0, 4, 16);
  const auto first_at = [&](const at::Tensor& row) {
    for (std::int64_t i = 0; i < row.numel(); ++i)
      if (row[i].item<std::int64_t>() == eos) return i;
    return row.numel();
  };
  const std::int64_t second_stop = first_at(free[1].narrow(0, 4, 16));
  const std::int64_t first_stop = first_at(generated_first);
  const at::Tensor stopped =
      loom::models::generate(model, prompt, {.max_new_tokens = 16, .eos_token_id = {eos}, .pad_token_id = 60});
  // Until both stopped (or 16): each row as before up to its end token, then the pad.
  const std::int64_t length = std::min<std::int64_t>(std::max(first_stop, second_stop) + 1, 16);
  REQUIRE(stopped.size(1) == 4 + length);
  for (std::int64_t row = 0; row < 2; ++row) {
    const std::int64_t stop = row == 0 ? first_stop : second_stop;
    for (std::int64_t i = 0; i < length; ++i) {
      CHECK(stopped[row][4 + i].item<std::int64_t>() == (i <= stop ? free[row][4 + i].item<std::int64_t>() : 60));
    }
  }
}

TEST_CASE("generation runs without gradients in eval mode and puts the model's mode back", "[generate]") {
  auto model = random_model(small(causal_lm_family::gemma3));
  model->train();
  const at::Tensor out = loom::models::generate(model, torch::tensor({1, 2, 3}, torch::kLong), {.max_new_tokens = 3});
  CHECK(model->is_training());
  CHECK(model->model->layers[0]->is_training());
  CHECK_FALSE(out.requires_grad());
  CHECK(torch::GradMode::is_enabled());
}

TEST_CASE("LoRA's adapters are in the generated tokens, under a job's module", "[generate][lora]") {
  const causal_lm_config config = small(causal_lm_family::llama);
  auto base =
      loom::build(loom::model<loom::models::CausalLM>(config) | loom::seeded(5), loom::runtime::single_process());
  auto adapted = loom::build(loom::model<loom::models::CausalLM>(config) | loom::seeded(5) |
                                 loom::lora(4, {"q_proj", "v_proj", "down_proj"}, {.dropout = 0.5}),
                             loom::runtime::single_process());
  const at::Tensor prompt = torch::tensor({{3, 1, 4, 1, 5}}, torch::kLong);
  const auto greedy = [&](auto& job) {
    return job.with_whole_module(
        [&](loom::models::CausalLM& model) { return loom::models::generate(model, prompt, {.max_new_tokens = 20}); });
  };
  // B starts at zero: the adapted model is the base one until its adapters move.
  CHECK(greedy(adapted).equal(greedy(base)));
  {
    torch::NoGradGuard no_grad;
    for (auto& item : adapted.module()->named_parameters())
      if (item.key().find("lora_B") != std::string::npos) item.value().normal_(0, 2);
  }
  const at::Tensor moved = greedy(adapted);
  CHECK_FALSE(moved.equal(greedy(base)));
  // Dropout (0.5) is off: the same tokens again, and those of the model's own forward in eval mode.
  CHECK(greedy(adapted).equal(moved));
  torch::NoGradGuard no_grad;
  adapted.module()->eval();
  CHECK(adapted.module()->forward(moved.narrow(1, 0, 24)).narrow(1, 4, 20).argmax(-1).equal(moved.narrow(1, 5, 20)));
}

TEST_CASE("generate refuses what it cannot do, in one sentence", "[generate][errors]") {
  auto model = random_model(small(causal_lm_family::llama));
  const at::Tensor prompt = torch::tensor({1, 2, 3}, torch::kLong);
  CHECK_THAT(refused(model, prompt, {.do_sample = true, .temperature = 0}),
             ContainsSubstring("loom: generate: temperature = 0 with do_sample: give a temperature above 0 (or "
                               "do_sample = false for the most likely token each step)"));
  CHECK_THAT(refused(model, prompt, {.do_sample = true, .top_p = 1.5}),
             ContainsSubstring("generate: top_p = 1.5 is outside (0, 1]: give a probability above 0"));
  CHECK_THAT(refused(model, prompt, {.do_sample = true, .top_p = 0}), ContainsSubstring("top_p = 0 is outside (0, 1]"));
  CHECK_THAT(refused(model, prompt, {.do_sample = true, .top_k = -1}), ContainsSubstring("top_k = -1 is negative"));
  CHECK_THAT(refused(model, prompt, {.max_new_tokens = 0}), ContainsSubstring("max_new_tokens = 0: give at least 1"));
  CHECK_THAT(refused(model, torch::zeros({30}, torch::kLong), {.max_new_tokens = 20}),
             ContainsSubstring("generate: a prompt of 30 tokens and max_new_tokens = 20 run past the model's "
                               "max_position_embeddings = 40: give a shorter prompt or fewer new tokens (at most 10)"));
  CHECK_THAT(refused(model, torch::tensor({1, 61}, torch::kLong), {}),
             ContainsSubstring("generate: the prompt's token 61 is outside the vocabulary: give an id in [0, 61)"));
  CHECK_THAT(refused(model, torch::tensor({1, 2}, torch::kInt), {}),
             ContainsSubstring("generate: a prompt of Int [2]: give token ids as an int64 tensor [seq]"));
  CHECK_THAT(refused(model, prompt, {.eos_token_id = {70}}), ContainsSubstring("eos_token_id 70 is outside"));
  // A cache is one batch's.
  torch::NoGradGuard no_grad;
  loom::models::kv_cache cache;
  (void)model->next_token_logits(torch::tensor({{1, 2}}, torch::kLong), cache);
  CHECK_THROWS_WITH(model->next_token_logits(torch::tensor({{1}, {2}}, torch::kLong), cache),
                    ContainsSubstring("give each sequence batch a cache of its own"));
}

// loom::models::CausalLM without transformers: causal_lm_config::from_json against config.json as
// transformers 4 and 5 write it, each refusal's sentence, the module's names (transformers' own, so
// that checkpoints load by name), the causal-LM loss (and forward(ids, labels)'s, chunk by chunk,
// against it: values, gradients and the bytes it holds), and the recipe's token files
// (dsl_examples/models/token_file.hpp).
#include <loom/loom.hpp>
#include <loom/models/causal_lm.hpp>
#include <models/token_file.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <catch2/matchers/catch_matchers_vector.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

using Catch::Matchers::ContainsSubstring;
using Catch::Matchers::StartsWith;
using loom::models::causal_lm_config;

namespace {

// A transformers 5 config.json (rope_parameters); `extra` keys, last, replace those of the same name.
std::string config_json(const std::string& extra = "") {
  return R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 96,
    "hidden_size": 32, "intermediate_size": 56, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-05, "hidden_act": "silu", "tie_word_embeddings": false,
    "rope_parameters": {"rope_theta": 500.0, "rope_type": "default"})" +
         extra + "}";
}

}  // namespace

TEST_CASE("config.json as transformers 5 writes it", "[llama]") {
  const causal_lm_config config = causal_lm_config::from_json(config_json(), "config.json");
  CHECK(config.vocab_size == 96);
  CHECK(config.num_key_value_heads == 2);
  CHECK(config.head_dim == 8);  // hidden_size / num_attention_heads
  CHECK(config.rope.theta == 500.0);
  CHECK(config.rms_norm_eps == 1e-5);
  CHECK(config.rope.type == loom::models::rope_parameters::scaling::none);
  CHECK_FALSE(config.tie_word_embeddings);
  CHECK(config.family == loom::models::causal_lm_family::llama);
  CHECK(config.layer_types.empty());
  CHECK_FALSE(config.qkv_bias);
  CHECK_FALSE(config.qk_norm);
}

TEST_CASE("config.json as transformers 4 writes it: rope_theta and rope_scaling", "[llama]") {
  const causal_lm_config config = causal_lm_config::from_json(
      R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 16, "intermediate_size": 8,
          "num_hidden_layers": 1, "num_attention_heads": 2, "head_dim": 6, "rope_theta": 1000000.0,
          "rope_scaling": {"type": "llama3", "factor": 32.0, "original_max_position_embeddings": 4096},
          "tie_word_embeddings": true})",
      "v4.json");
  CHECK(config.num_key_value_heads == 2);  // num_attention_heads when left out
  CHECK(config.head_dim == 6);
  CHECK(config.rope.theta == 1e6);
  REQUIRE(config.rope.type == loom::models::rope_parameters::scaling::llama3);
  CHECK(config.rope.factor == 32.0);
  CHECK(config.rope.low_freq_factor == 1.0);
  CHECK(config.rope.original_max_position_embeddings == 4096);
  CHECK(config.tie_word_embeddings);
}

TEST_CASE("a config.json loom cannot build is one sentence naming the file and the key", "[llama][errors]") {
  const auto refused = [](const std::string& text) {
    try {
      (void)causal_lm_config::from_json(text, "ckpt/config.json");
    } catch (const std::invalid_argument& error) {
      return std::string(error.what());
    }
    return std::string("accepted");
  };
  CHECK_THAT(refused(R"({"architectures": ["FalconForCausalLM"]})"),
             StartsWith("loom: CausalLM config 'ckpt/config.json': 'architectures' is [\"FalconForCausalLM\"]: "
                        "loom::models::CausalLM reads LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, "
                        "Qwen3ForCausalLM, Gemma3ForCausalLM"));
  CHECK_THAT(refused(R"({"model_type": "phi3"})"),
             ContainsSubstring("'model_type' is \"phi3\": loom::models::CausalLM reads the model types of"));
  CHECK_THAT(refused(R"({"vocab_size": 3})"), ContainsSubstring("it has neither 'architectures' nor 'model_type'"));
  CHECK_THAT(refused(R"({"_class_name": "WanTransformer3DModel", "num_layers": 2})"),
             ContainsSubstring("'_class_name' is \"WanTransformer3DModel\": a diffusers model, not a transformers "
                               "causal language model; give the folder of a checkpoint of"));
  CHECK_THAT(refused(R"({"model_type": "llama"})"),
             ContainsSubstring("'vocab_size' is missing: a Llama config.json gives it as a positive whole number"));
  CHECK_THAT(refused(config_json(R"(, "hidden_size": 30)")),
             ContainsSubstring("num_attention_heads = 4 does not divide hidden_size = 30"));
  CHECK_THAT(refused(config_json(R"(, "num_key_value_heads": 3)")),
             ContainsSubstring("num_key_value_heads = 3 does not divide num_attention_heads = 4"));
  CHECK_THAT(refused(config_json(R"(, "rope_parameters": {"rope_type": "yarn", "factor": 4.0})")),
             ContainsSubstring("'rope_parameters' has rope_type 'yarn': loom computes the default rotary embedding, "
                               "linear's and llama3's"));
  CHECK_THAT(refused(config_json(R"(, "pad_token_id": 96)")),
             ContainsSubstring("'pad_token_id' is 96: give a token id below vocab_size = 96, or null"));
  CHECK_THAT(refused(config_json(R"(, "hidden_act": "gelu")")),
             ContainsSubstring("'hidden_act' is \"gelu\": Llama's MLP is SwiGLU, silu"));
  CHECK_THAT(refused(config_json(R"(, "vocab_size": "96")")), ContainsSubstring("'vocab_size' is \"96\""));
  CHECK_THAT(refused("not json"), ContainsSubstring("not a JSON object"));
  CHECK_THROWS_WITH(causal_lm_config::from_pretrained("/nonexistent/checkpoint"),
                    ContainsSubstring("cannot be read: give a checkpoint folder holding config.json"));
}

TEST_CASE("the module's names are transformers' names", "[llama]") {
  causal_lm_config config = causal_lm_config::from_json(config_json(R"(, "attention_bias": true)"), "config.json");
  config.num_hidden_layers = 1;
  loom::models::CausalLM untied(config);
  const std::vector<std::string> expected{"model.embed_tokens.weight",
                                          "model.layers.0.self_attn.q_proj.weight",
                                          "model.layers.0.self_attn.q_proj.bias",
                                          "model.layers.0.self_attn.k_proj.weight",
                                          "model.layers.0.self_attn.k_proj.bias",
                                          "model.layers.0.self_attn.v_proj.weight",
                                          "model.layers.0.self_attn.v_proj.bias",
                                          "model.layers.0.self_attn.o_proj.weight",
                                          "model.layers.0.self_attn.o_proj.bias",
                                          "model.layers.0.mlp.gate_proj.weight",
                                          "model.layers.0.mlp.up_proj.weight",
                                          "model.layers.0.mlp.down_proj.weight",
                                          "model.layers.0.input_layernorm.weight",
                                          "model.layers.0.post_attention_layernorm.weight",
                                          "model.norm.weight",
                                          "lm_head.weight"};
  CHECK(untied->named_parameters().keys() == expected);
  CHECK(untied->named_buffers().is_empty());  // the rotary frequencies are computed, in no state_dict
  config.tie_word_embeddings = true;
  loom::models::CausalLM tied(config);
  CHECK(tied->named_parameters().keys().back() == "model.norm.weight");  // no lm_head.weight of its own
  CHECK(untied->model->layers->size() == 1);
  CHECK(untied->model->layers[0]->as<loom::models::DecoderLayer>() != nullptr);  // a unit
}

namespace {

using loom::models::layer_attention;
using loom::models::rope_parameters;

std::vector<std::string> parameter_names(const causal_lm_config& config) {
  loom::models::CausalLM model(config);
  return model->named_parameters().keys();
}

// "full full sliding": each layer's attention.
std::string layer_kinds(const causal_lm_config& config) {
  std::string text;
  for (const layer_attention kind : config.layer_types) {
    if (!text.empty()) text += ' ';
    text += kind == layer_attention::full ? "full" : "sliding";
  }
  return text;
}

bool has(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace

TEST_CASE("Qwen2 and Qwen2.5: biases on q, k and v but not o; the window on the layers the config names",
          "[causal_lm][qwen2]") {
  // Qwen2.5-0.5B's config.json (transformers 4): no window in use, a tied head.
  const std::string qwen25 = R"({"architectures": ["Qwen2ForCausalLM"], "hidden_act": "silu", "hidden_size": 32,
    "intermediate_size": 48, "max_position_embeddings": 32768, "max_window_layers": 2, "model_type": "qwen2",
    "num_attention_heads": 4, "num_hidden_layers": 3, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true, "use_sliding_window": false,
    "vocab_size": 64)";
  const causal_lm_config config = causal_lm_config::from_json(qwen25 + "}", "qwen2.5.json");
  CHECK(config.family == loom::models::causal_lm_family::qwen2);
  CHECK(config.qkv_bias);
  CHECK_FALSE(config.output_bias);
  CHECK(config.tie_word_embeddings);
  CHECK(config.rope.theta == 1e6);
  CHECK(config.layer_types.empty());  // use_sliding_window is false
  const std::vector<std::string> names = parameter_names(config);
  CHECK(has(names, "model.layers.0.self_attn.q_proj.bias"));
  CHECK(has(names, "model.layers.0.self_attn.v_proj.bias"));
  CHECK_FALSE(has(names, "model.layers.0.self_attn.o_proj.bias"));
  CHECK_FALSE(has(names, "lm_head.weight"));

  // With the window: the layers from max_window_layers on, or those layer_types names.
  const std::string windowed = R"(, "use_sliding_window": true, "sliding_window": 16)";
  const causal_lm_config by_count = causal_lm_config::from_json(qwen25 + windowed + "}", "qwen2.json");
  CHECK(by_count.sliding_window == 16);
  CHECK(layer_kinds(by_count) == "full full sliding");
  const causal_lm_config by_type = causal_lm_config::from_json(
      qwen25 + windowed + R"(, "layer_types": ["sliding_attention", "full_attention", "full_attention"]})", "q.json");
  CHECK(by_type.attention_of(0) == layer_attention::sliding);
  CHECK(by_type.attention_of(2) == layer_attention::full);
  CHECK_THROWS_WITH(
      causal_lm_config::from_json(qwen25 + windowed + R"(, "layer_types": ["full_attention"]})", "q.json"),
      ContainsSubstring("'layer_types' is [\"full_attention\"]: give one of \"full_attention\" and "
                        "\"sliding_attention\" for each of the 3 layers"));
}

TEST_CASE("Qwen3: q and k normed per head, a head_dim of its own, attention_bias on all four", "[causal_lm][qwen3]") {
  const std::string qwen3 = R"({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 32, "intermediate_size": 48,
    "model_type": "qwen3", "num_attention_heads": 4, "num_hidden_layers": 1, "num_key_value_heads": 2,
    "vocab_size": 64, "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"})";
  const causal_lm_config config = causal_lm_config::from_json(qwen3 + "}", "qwen3.json");
  CHECK(config.head_dim == 128);  // Qwen3Config's, not hidden_size / heads
  CHECK(config.qk_norm);
  CHECK_FALSE(config.qkv_bias);
  const std::vector<std::string> names = parameter_names(config);
  CHECK(has(names, "model.layers.0.self_attn.q_norm.weight"));
  CHECK(has(names, "model.layers.0.self_attn.k_norm.weight"));
  CHECK(has(names, "lm_head.weight"));
  const causal_lm_config biased =
      causal_lm_config::from_json(qwen3 + R"(, "attention_bias": true, "head_dim": 6})", "qwen3.json");
  CHECK(biased.head_dim == 6);
  CHECK(has(parameter_names(biased), "model.layers.0.self_attn.o_proj.bias"));
}

TEST_CASE("Mistral: every layer in the sliding window when sliding_window is set", "[causal_lm][mistral]") {
  const std::string mistral = R"({"architectures": ["MistralForCausalLM"], "hidden_size": 32, "intermediate_size": 48,
    "model_type": "mistral", "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
    "vocab_size": 64, "head_dim": 10)";
  const causal_lm_config windowed = causal_lm_config::from_json(mistral + R"(, "sliding_window": 4096})", "m.json");
  CHECK(windowed.head_dim == 10);
  CHECK(windowed.sliding_window == 4096);
  CHECK(layer_kinds(windowed) == "sliding sliding");
  const causal_lm_config whole = causal_lm_config::from_json(mistral + R"(, "sliding_window": null})", "m.json");
  CHECK(whole.layer_types.empty());
  CHECK_THAT(parameter_names(whole), Catch::Matchers::VectorContains(std::string("lm_head.weight")));
}

TEST_CASE("Gemma 3: (1 + w) norms around both sublayers, scaled embeddings, local and global layers",
          "[causal_lm][gemma3]") {
  // As transformers 4 wrote gemma-3-1b's (its sizes cut down).
  const std::string gemma = R"({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
    "hidden_size": 32, "intermediate_size": 48, "num_attention_heads": 4, "num_hidden_layers": 7,
    "num_key_value_heads": 1, "head_dim": 8, "vocab_size": 64, "hidden_activation": "gelu_pytorch_tanh",
    "query_pre_attn_scalar": 256, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
    "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "sliding_window": 512, "sliding_window_pattern": 6,
    "attn_logit_softcapping": null, "final_logit_softcapping": null, "pad_token_id": 0)";
  const causal_lm_config config = causal_lm_config::from_json(gemma + "}", "gemma.json");
  CHECK(config.family == loom::models::causal_lm_family::gemma3);
  CHECK(config.tie_word_embeddings);  // Gemma3TextConfig's default
  CHECK(config.norm == loom::models::norm_weighting::offset_scale);
  CHECK(config.sandwich_norms);
  CHECK(config.scaled_embeddings);
  CHECK(config.activation == loom::models::mlp_activation::gelu_tanh);
  CHECK(config.query_pre_attn_scalar == 256);
  CHECK_FALSE(config.final_logit_softcapping);
  CHECK(config.pad_token_id == 0);
  CHECK(config.rope.theta == 1e6);
  CHECK(config.rope.type == rope_parameters::scaling::linear);
  CHECK(config.rope.factor == 8);
  CHECK(config.sliding_rope.theta == 1e4);
  CHECK(config.sliding_rope.type == rope_parameters::scaling::none);
  // Every sixth layer global, the others in the window.
  CHECK(layer_kinds(config) == "sliding sliding sliding sliding sliding full sliding");
  CHECK(config.sliding_window == 512);

  const std::vector<std::string> names = parameter_names(config);
  for (const std::string norm : {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                                 "post_feedforward_layernorm", "self_attn.q_norm", "self_attn.k_norm"}) {
    CHECK(has(names, "model.layers.0." + norm + ".weight"));
  }
  CHECK_FALSE(has(names, "lm_head.weight"));
  // (1 + w) from zeros: a fresh model's norms are the identity, as Gemma's initialiser leaves them.
  loom::models::CausalLM model(config);
  CHECK(model->model->norm->weight.abs().max().item<double>() == 0);

  // transformers 5's per-layer-type rope_parameters, and soft-capping.
  const causal_lm_config v5 =
      causal_lm_config::from_json(gemma + R"(, "final_logit_softcapping": 30.0, "rope_parameters": {
        "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 500000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 20000.0}}})",
                                  "gemma5.json");
  CHECK(v5.final_logit_softcapping == 30.0);
  CHECK(v5.rope.theta == 5e5);
  CHECK(v5.rope.factor == 4);
  CHECK(v5.sliding_rope.theta == 2e4);

  CHECK_THROWS_WITH(
      causal_lm_config::from_json(gemma + R"(, "use_bidirectional_attention": true})", "gemma.json"),
      ContainsSubstring("'use_bidirectional_attention' is true: loom builds Gemma 3's causal language model"));
  CHECK_THROWS_WITH(causal_lm_config::from_json(gemma + R"(, "hidden_activation": "gelu"})", "gemma.json"),
                    ContainsSubstring("'hidden_activation' is \"gelu\": Gemma 3's MLP is gated by GELU's tanh form, "
                                      "gelu_pytorch_tanh"));
}

TEST_CASE("modules_to_save on a tied head: the embedding it reads is what trains, named in the refusal",
          "[causal_lm][lora]") {
  causal_lm_config config = causal_lm_config::from_json(config_json(R"(, "tie_word_embeddings": true)"), "c.json");
  config.num_hidden_layers = 1;
  const auto tied = loom::model<loom::models::CausalLM>(config) | loom::seeded(1);
  CHECK_THROWS_WITH(
      loom::build(tied | loom::lora(4, {"q_proj"}, {.modules_to_save = {"lm_head"}}), loom::runtime::single_process()),
      ContainsSubstring("lora modules_to_save 'lm_head' selects no module of") &&
          ContainsSubstring("its lm_head.weight reads model.embed_tokens.weight (they are tied); save "
                            "'model.embed_tokens' instead"));
  auto job = loom::build(tied | loom::lora(4, {"q_proj"}, {.modules_to_save = {"embed_tokens"}}),
                         loom::runtime::single_process());
  CHECK(job.module()->model->embed_tokens->weight.requires_grad());
  const std::filesystem::path folder = std::filesystem::temp_directory_path() / "loom-test-causal-lm-tied-saving";
  std::filesystem::remove_all(folder);
  job.save_adapter(folder);
  // PEFT's layout with ensure_weight_tying: the head's key beside the embedding's, the same values.
  const loom::peft_lora_adapter written = loom::load_peft_adapter(folder);
  CHECK(written.ensure_weight_tying);
  std::map<std::string, at::Tensor> saved;
  for (const loom::named_tensor& t : written.module_tensors) saved.emplace(t.name, t.tensor);
  REQUIRE(saved.size() == 2);
  CHECK(torch::equal(saved.at("model.embed_tokens.weight"), saved.at("lm_head.weight")));
  job.load_adapter(folder);
}

TEST_CASE("causal_lm_loss predicts the next token, in fp32, leaving out labels of -100", "[llama]") {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const at::Tensor logits = torch::randn({2, 5, 7}, gen).to(at::kBFloat16);
  at::Tensor labels = torch::randint(0, 7, {2, 5}, gen);
  labels.index_put_({1, 4}, -100);
  const at::Tensor loss = loom::models::causal_lm_loss(logits, labels);
  CHECK(loss.scalar_type() == at::kFloat);
  // By hand: position t against labels[t + 1], the 7 that count.
  const at::Tensor wide = logits.to(at::kFloat);
  double total = 0;
  int counted = 0;
  for (int b = 0; b < 2; ++b) {
    for (int t = 0; t < 4; ++t) {
      const std::int64_t target = labels.index({b, t + 1}).item<std::int64_t>();
      if (target == -100) continue;
      total -= wide.index({b, t}).log_softmax(-1).index({target}).item<double>();
      ++counted;
    }
  }
  CHECK(counted == 7);
  CHECK(std::abs(loss.item<double>() - total / counted) < 1e-6);
}

namespace {

// The loss and every parameter's gradient after one backward.
struct loss_and_grads {
  at::Tensor loss;
  std::map<std::string, at::Tensor> grads;
};

// causal_lm_loss(forward(ids), labels) without `chunk`, else forward(ids, labels) with loss_chunk_tokens = chunk.
template <class Job>
loss_and_grads step_of(Job& job, const at::Tensor& ids, const at::Tensor& labels, std::optional<std::int64_t> chunk) {
  job.zero_grad();
  at::Tensor loss;
  if (chunk) {
    job.module()->loss_chunk_tokens = *chunk;
    loss = job.forward(ids, labels);
  } else {
    loss = loom::models::causal_lm_loss(job.forward(ids), labels);
  }
  job.backward(loss);
  loss_and_grads out{loss.detach().clone(), {}};
  for (const auto& item : job.module()->named_parameters()) {
    if (item.value().grad().defined()) out.grads.emplace(item.key(), item.value().grad().to(at::kFloat).clone());
  }
  return out;
}

// How far `a` is from `b`, relative to b's largest magnitude.
double relative_difference(const at::Tensor& a, const at::Tensor& b) {
  const double scale = std::max(b.abs().max().item<double>(), 1e-12);
  return (a.to(at::kFloat) - b.to(at::kFloat)).abs().max().item<double>() / scale;
}

// forward(ids, labels) at several chunk sizes (one token, sizes that do not divide the 2 × 9 tokens,
// one that does, all, more than all) against the unchunked loss: the loss and every gradient within
// `tolerance` of its largest magnitude, and the gradients of `must_train` among them.
template <class Plan>
void check_chunked_loss(const Plan& plan, double tolerance, const std::vector<std::string>& must_train) {
  auto job = loom::build(plan, loom::runtime::single_process());
  // LoRA's B starts at zero, which would leave A's gradient zero: give every adapter a value.
  {
    torch::NoGradGuard no_grad;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
    for (const auto& item : job.module()->named_parameters()) {
      if (item.key().find("lora_B") != std::string::npos) {
        item.value().copy_(0.1 * torch::randn(item.value().sizes(), gen));
      }
    }
  }
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const std::int64_t vocab = job.module()->config.vocab_size;
  const at::Tensor ids = torch::randint(vocab, {2, 9}, gen, torch::kLong);
  at::Tensor labels = ids.clone();
  labels.index_put_({0, 3}, -100);
  labels.index_put_({1, 8}, -100);
  labels.index_put_({1, 1}, -100);
  const loss_and_grads whole = step_of(job, ids, labels, std::nullopt);
  for (const std::string& name : must_train) {
    CAPTURE(name);
    REQUIRE(whole.grads.contains(name));
    CHECK(whole.grads.at(name).abs().max().item<double>() > 0);
  }
  for (const std::int64_t chunk : {1, 4, 5, 6, 18, 0, 1000}) {
    CAPTURE(chunk);
    const loss_and_grads chunked = step_of(job, ids, labels, chunk);
    CHECK(chunked.loss.scalar_type() == at::kFloat);
    CHECK(relative_difference(chunked.loss, whole.loss) <= tolerance);
    REQUIRE(chunked.grads.size() == whole.grads.size());
    for (const auto& [name, grad] : whole.grads) {
      CAPTURE(name);
      REQUIRE(chunked.grads.contains(name));
      CHECK(relative_difference(chunked.grads.at(name), grad) <= tolerance);
    }
  }
}

causal_lm_config small_config(const std::string& extra = "") {
  causal_lm_config config = causal_lm_config::from_json(config_json(extra), "c.json");
  return config;
}

}  // namespace

TEST_CASE("forward(ids, labels) is causal_lm_loss(forward(ids), labels) chunk by chunk: loss and gradients",
          "[causal_lm][loss]") {
  const auto model_of = [](const causal_lm_config& config) {
    return loom::model<loom::models::CausalLM>(config) | loom::seeded(3);
  };
  // The hidden states' gradient reaches every parameter below the head: the norm's, the layers', the embedding's.
  SECTION("a head of its own, every parameter trained") {
    check_chunked_loss(
        model_of(small_config()), 1e-5,
        {"lm_head.weight", "model.norm.weight", "model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight"});
  }
  SECTION("a LoRA adapter on the head, the base frozen") {
    check_chunked_loss(model_of(small_config()) | loom::lora(4, {"lm_head", "q_proj"}), 1e-5,
                       {"lm_head.lora_A", "lm_head.lora_B", "model.layers.1.self_attn.q_proj.lora_A"});
  }
  SECTION("a tied head: the embedding trains through both") {
    check_chunked_loss(model_of(small_config(R"(, "tie_word_embeddings": true)")), 1e-5,
                       {"model.embed_tokens.weight", "model.norm.weight"});
  }
  SECTION("a tied head saved as a module beside LoRA") {
    check_chunked_loss(model_of(small_config(R"(, "tie_word_embeddings": true)")) |
                           loom::lora(4, {"q_proj"}, {.modules_to_save = {"embed_tokens"}}),
                       1e-5, {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.lora_B"});
  }
  SECTION("Gemma 3: soft-capped logits over a tied head") {
    causal_lm_config config = causal_lm_config::for_family(loom::models::causal_lm_family::gemma3);
    const causal_lm_config sizes = small_config();
    config.vocab_size = sizes.vocab_size;
    config.hidden_size = sizes.hidden_size;
    config.intermediate_size = sizes.intermediate_size;
    config.num_hidden_layers = 2;
    config.num_attention_heads = sizes.num_attention_heads;
    config.num_key_value_heads = sizes.num_key_value_heads;
    config.head_dim = sizes.head_dim;
    config.final_logit_softcapping = 3;  // low enough that most logits are capped hard
    config.query_pre_attn_scalar = 8;
    check_chunked_loss(model_of(config), 1e-5, {"model.embed_tokens.weight", "model.layers.1.mlp.up_proj.weight"});
  }
  SECTION("bf16: a chunk's head gradient rounded once more, summed in fp32") {
    check_chunked_loss(model_of(small_config()) | loom::default_dtype(loom::bf16), 1.0 / 64,
                       {"lm_head.weight", "model.norm.weight"});
  }
  SECTION("fp32 weights under autocast to bf16") {
    check_chunked_loss(model_of(small_config()) | loom::mixed_precision({.param = loom::bf16}), 1.0 / 64,
                       {"lm_head.weight", "model.embed_tokens.weight"});
  }
}

TEST_CASE("forward(ids, labels) refuses labels that are not the tokens' and a negative chunk", "[causal_lm][loss]") {
  auto job = loom::build(loom::model<loom::models::CausalLM>(small_config()) | loom::seeded(3),
                         loom::runtime::single_process());
  const at::Tensor ids = torch::zeros({2, 6}, torch::kLong);
  CHECK_THROWS_WITH(job.forward(ids, torch::zeros({2, 5}, torch::kLong)),
                    ContainsSubstring("CausalLM: labels [2, 5] for token ids [2, 6]: give labels [batch, seq]"));
  job.module()->loss_chunk_tokens = -1;
  CHECK_THROWS_WITH(job.forward(ids, ids), ContainsSubstring("loss_chunk_tokens is -1"));
}

namespace {

// LibTorch's CPU allocator with the bytes it has handed out and not taken back counted, and their
// peak since the last reset (bench/build_memory.cpp's, with a reset).
class counting_allocator final : public c10::Allocator {
 public:
  explicit counting_allocator(c10::Allocator* inner) : inner_(inner) {}

  c10::DataPtr allocate(std::size_t bytes) override {
    auto* held = new allocation{inner_->allocate(bytes), bytes, this};
    const std::int64_t now = live_ += static_cast<std::int64_t>(bytes);
    std::int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return {held->data.get(), held, &release, held->data.device()};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* destination, const void* source, std::size_t count) const override {
    std::memcpy(destination, source, count);
  }

  // The peak from now on starts at what is live now; returns that.
  std::int64_t reset_peak() {
    const std::int64_t now = live_.load();
    peak_ = now;
    return now;
  }
  [[nodiscard]] std::int64_t peak() const { return peak_.load(); }

 private:
  struct allocation {
    c10::DataPtr data;
    std::size_t bytes;
    counting_allocator* owner;
  };
  static void release(void* context) {
    auto* held = static_cast<allocation*>(context);
    held->owner->live_ -= static_cast<std::int64_t>(held->bytes);
    delete held;
  }

  c10::Allocator* inner_;
  std::atomic<std::int64_t> live_{0};
  std::atomic<std::int64_t> peak_{0};
};

// The counting allocator as the CPU's for a scope, and the one before it back after.
class [[nodiscard]] counting_scope {
 public:
  counting_scope() : previous_(c10::GetCPUAllocator()), counted_(previous_) {
    c10::SetCPUAllocator(&counted_, priority);
  }
  ~counting_scope() { c10::SetCPUAllocator(previous_, priority); }
  counting_scope(const counting_scope&) = delete;
  counting_scope& operator=(const counting_scope&) = delete;
  counting_allocator& counted() { return counted_; }

 private:
  static constexpr std::uint8_t priority = 100;
  c10::Allocator* previous_;
  counting_allocator counted_;
};

}  // namespace

TEST_CASE("forward(ids, labels) never holds every token's fp32 logits, forward or backward", "[causal_lm][loss]") {
  // A vocabulary far wider than the model: one [tokens, vocab] fp32 tensor outweighs the rest.
  causal_lm_config config = small_config();
  config.vocab_size = 8192;
  config.hidden_size = 16;
  config.intermediate_size = 16;
  config.num_hidden_layers = 1;
  config.num_attention_heads = 2;
  config.num_key_value_heads = 2;
  config.head_dim = 8;
  const std::int64_t batch = 2, seq = 256;
  const std::int64_t full_logits_bytes = batch * seq * config.vocab_size * 4;  // 16 MiB
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
  const at::Tensor ids = torch::randint(config.vocab_size, {batch, seq}, gen, torch::kLong);
  std::int64_t chunked_peak = 0, unchunked_peak = 0;
  {
    counting_scope scope;
    auto job =
        loom::build(loom::model<loom::models::CausalLM>(config) | loom::seeded(3), loom::runtime::single_process());
    job.module()->loss_chunk_tokens = 32;
    const auto peak_of = [&](const auto& step) {
      job.zero_grad();
      const std::int64_t before = scope.counted().reset_peak();
      job.backward(step());
      return scope.counted().peak() - before;
    };
    // Twice each, so that what the first step leaves behind (the gradients' buffers) is in both.
    for (int i = 0; i < 2; ++i) {
      chunked_peak = peak_of([&] { return job.forward(ids, ids); });
      unchunked_peak = peak_of([&] { return loom::models::causal_lm_loss(job.forward(ids), ids); });
    }
  }
  INFO("peak bytes over forward and backward: chunked " << chunked_peak << ", unchunked " << unchunked_peak
                                                        << ", one fp32 logits tensor " << full_logits_bytes);
  CHECK(chunked_peak < full_logits_bytes);
  CHECK(unchunked_peak > full_logits_bytes);
  // What the chunked loss holds is a few of a chunk's [32, vocab] tensors and the head's and the
  // embedding's gradients (4.1 MiB when measured): under a third.
  CHECK(chunked_peak < full_logits_bytes / 3);
}

TEST_CASE("pretrained(path) loads by name while the model is built: strict, cast to the model's dtype",
          "[llama][pretrained]") {
  namespace fs = std::filesystem;
  causal_lm_config config = causal_lm_config::from_json(config_json(), "config.json");
  const fs::path folder = fs::temp_directory_path() / "loom-test-llama-pretrained";
  fs::remove_all(folder);
  const auto base = loom::model<loom::models::CausalLM>(config);
  auto saved = loom::build(base | loom::seeded(1), loom::runtime::single_process());
  saved.save_weights(folder);

  auto loaded =
      loom::build(base | loom::seeded(2) | loom::pretrained(folder.string()), loom::runtime::single_process());
  CHECK_THAT(loaded.describe(), ContainsSubstring("build: weights from '" + folder.string() + "': 21 tensors"));
  const loom::tensor_state want = saved.state_dict();
  const loom::tensor_state got = loaded.state_dict();
  REQUIRE(want.size() == got.size());
  for (std::size_t i = 0; i < want.size(); ++i) CHECK(torch::equal(want[i].tensor, got[i].tensor));

  // A frozen base built in bf16 takes the checkpoint's fp32 weights in bf16; the adapters are fp32.
  auto narrow = loom::build(base | loom::seeded(2) | loom::default_dtype(loom::bf16) |
                                loom::pretrained(folder.string()) | loom::lora(2, {"q_proj"}),
                            loom::runtime::single_process());
  std::map<std::string, at::Tensor> by_name;
  for (const loom::named_tensor& t : narrow.state_dict()) by_name[t.name] = t.tensor;
  CHECK(by_name.size() == want.size() + 2 * static_cast<std::size_t>(config.num_hidden_layers));
  for (const loom::named_tensor& t : want) {
    CAPTURE(t.name);
    CHECK(by_name.at(t.name).scalar_type() == at::kBFloat16);
    CHECK(torch::equal(by_name.at(t.name), t.tensor.to(at::kBFloat16)));
  }
  CHECK(by_name.at("model.layers.0.self_attn.q_proj.lora_A").scalar_type() == at::kFloat);

  config.tie_word_embeddings = true;  // the checkpoint holds lm_head.weight, which a tied model has not
  CHECK_THROWS_WITH(
      loom::build(loom::model<loom::models::CausalLM>(config) | loom::pretrained(folder.string()),
                  loom::runtime::single_process()),
      ContainsSubstring("pretrained(\"" + folder.string() +
                        "\"): the weights do not match the model: missing [], unexpected [lm_head.weight]"));
}

TEST_CASE("save_pretrained writes what from_pretrained reads: the checkpoint's dtypes, its config and tokenizer",
          "[llama][pretrained]") {
  namespace fs = std::filesystem;
  const causal_lm_config config = causal_lm_config::from_json(config_json(), "config.json");
  const fs::path folder = fs::temp_directory_path() / "loom-test-llama-save-pretrained";
  fs::remove_all(folder);
  const auto base = loom::model<loom::models::CausalLM>(config);
  {
    // A bf16 checkpoint, with its model files beside it.
    auto saved = loom::build(base | loom::seeded(1), loom::runtime::single_process());
    std::vector<loom::named_tensor> narrow;
    for (const loom::named_tensor& t : saved.state_dict()) narrow.push_back({t.name, t.tensor.to(at::kBFloat16)});
    loom::save_weights(folder / "checkpoint", narrow);
  }
  for (const char* name : {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"}) {
    std::ofstream(folder / "checkpoint" / name) << R"({"from": "the checkpoint"})";
  }
  // Built in fp32 from it, adapted and merged: written back in bf16.
  auto job = loom::build(
      base | loom::seeded(2) | loom::pretrained((folder / "checkpoint").string()) | loom::lora(2, {"q_proj"}),
      loom::runtime::single_process());
  CHECK_THROWS_WITH(job.save_pretrained(folder / "merged"), ContainsSubstring("call job.merge() first"));
  // Its adapter names its task and base model, as AutoPeftModelForCausalLM needs.
  job.save_adapter(folder / "adapter");
  std::ifstream adapter_config(folder / "adapter" / "adapter_config.json");
  const std::string adapter_text((std::istreambuf_iterator<char>(adapter_config)), {});
  CHECK_THAT(adapter_text, ContainsSubstring(R"("task_type": "CAUSAL_LM")"));
  CHECK_THAT(adapter_text, ContainsSubstring(R"("base_model_name_or_path": ")" +
                                             fs::absolute(folder / "checkpoint").string() + "\""));
  job.merge();
  job.save_pretrained(folder / "merged");
  for (const char* name : {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"}) {
    CAPTURE(name);
    CHECK(fs::exists(folder / "merged" / name));
  }
  CHECK_FALSE(fs::exists(folder / "merged" / "special_tokens_map.json"));  // the checkpoint has none
  const std::vector<loom::named_tensor> written = loom::load_weights(folder / "merged");
  CHECK(written.size() == 21);
  for (const loom::named_tensor& t : written) {
    CAPTURE(t.name);
    CHECK(t.tensor.scalar_type() == at::kBFloat16);
  }
  auto without = loom::build(base | loom::seeded(2), loom::runtime::single_process());
  CHECK_THROWS_WITH(without.save_pretrained(folder / "other"), ContainsSubstring("has no pretrained(...) checkpoint"));
}

namespace {

// An llm.c token file: `magic`, version, `count` in the header, then `ids` of `width` bytes each.
std::filesystem::path token_file_of(const std::string& name, std::int32_t magic, std::int32_t count,
                                    const std::vector<std::uint32_t>& ids, std::size_t width) {
  const auto path = std::filesystem::temp_directory_path() / ("loom-test-tokens-" + name + ".bin");
  std::ofstream out(path, std::ios::binary);
  std::vector<std::int32_t> header(token_file::header_ints, 0);
  header[0] = magic;
  header[1] = magic == token_file::gpt2_magic ? 1 : 7;
  header[2] = count;
  out.write(reinterpret_cast<const char*>(header.data()), static_cast<std::streamsize>(header.size() * 4));
  for (const std::uint32_t id : ids) out.write(reinterpret_cast<const char*>(&id), static_cast<std::streamsize>(width));
  return path;
}

}  // namespace

TEST_CASE("token files as llm.c writes them: uint16 and uint32 ids, and each refusal names the file",
          "[llama][tokens]") {
  const at::Tensor narrow = token_file::load(token_file_of("u16", token_file::gpt2_magic, 3, {7, 0, 255}, 2), 256);
  CHECK(narrow.scalar_type() == at::kLong);
  CHECK(narrow.equal(torch::tensor({7, 0, 255}, torch::kLong)));
  const at::Tensor wide =
      token_file::load(token_file_of("u32", token_file::llama3_magic, 2, {70000, 128255}, 4), 128256);
  CHECK(wide.equal(torch::tensor({70000, 128255}, torch::kLong)));

  CHECK_THROWS_WITH(token_file::load(token_file_of("beyond", token_file::gpt2_magic, 3, {1, 2, 300}, 2), 256),
                    ContainsSubstring("token 2 is id 300, not below the model's vocab_size 256"));
  CHECK_THROWS_WITH(token_file::load(token_file_of("short", token_file::gpt2_magic, 4, {1, 2, 3}, 2), 256),
                    ContainsSubstring("its header counts 4 tokens of 2 bytes, 1032 bytes in all, but the file has "
                                      "1030: it is truncated"));
  CHECK_THROWS_WITH(token_file::load(token_file_of("long", token_file::gpt2_magic, 2, {1, 2, 3}, 2), 256),
                    ContainsSubstring("but the file has 1030") && !ContainsSubstring("truncated"));
  CHECK_THROWS_WITH(token_file::load(token_file_of("magic", 12345, 3, {1, 2, 3}, 2), 256),
                    ContainsSubstring("no llm.c header") && ContainsSubstring("make_tokens.py"));
  CHECK_THROWS_WITH(token_file::load(token_file_of("empty", token_file::gpt2_magic, 0, {}, 2), 256),
                    ContainsSubstring("its header counts 0 tokens: there is nothing to train on"));
  CHECK_THROWS_WITH(token_file::load("/nonexistent/tokens.bin", 256),
                    ContainsSubstring("token file '/nonexistent/tokens.bin': it cannot be read"));
}

TEST_CASE("pretrained(path) names the file or the tensor that is wrong, before a byte is copied",
          "[llama][pretrained][errors]") {
  namespace fs = std::filesystem;
  const causal_lm_config config = causal_lm_config::from_json(config_json(), "config.json");
  const fs::path folder = fs::temp_directory_path() / "loom-test-llama-pretrained-bad";
  fs::remove_all(folder);
  const auto base = loom::model<loom::models::CausalLM>(config);
  auto saved = loom::build(base | loom::seeded(1), loom::runtime::single_process());
  saved.save_weights(folder, /*max_shard_bytes=*/20'000);  // an index and several files
  REQUIRE(fs::exists(folder / "model.safetensors.index.json"));
  const auto build = [&] {
    return loom::build(base | loom::seeded(2) | loom::pretrained(folder.string()), loom::runtime::single_process());
  };
  (void)build();

  fs::path second;
  for (const auto& file : fs::directory_iterator(folder)) {
    if (file.path().filename().string().starts_with("model-00002-of-")) second = file.path();
  }
  REQUIRE(!second.empty());
  const fs::path aside = folder / "aside";
  fs::rename(second, aside);
  CHECK_THROWS_WITH(build(), ContainsSubstring(second.string()));
  fs::rename(aside, second);

  fs::resize_file(second, fs::file_size(second) - 7);  // truncated: its header promises bytes that are not there
  CHECK_THROWS_WITH(build(), ContainsSubstring("'" + second.string() + "' is not a valid safetensors file"));

  // A checkpoint of another shape: the tensor named, with both shapes.
  fs::remove_all(folder);
  causal_lm_config wider = config;
  wider.intermediate_size = 64;
  auto other =
      loom::build(loom::model<loom::models::CausalLM>(wider) | loom::seeded(1), loom::runtime::single_process());
  other.save_weights(folder);
  CHECK_THROWS_WITH(build(), ContainsSubstring("'model.layers.0.mlp.gate_proj.weight' is Float[64,32] in the weights "
                                               "but Float[56,32] in the model"));
}

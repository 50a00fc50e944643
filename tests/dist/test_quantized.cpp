// quantized(...) under every strategy: a CausalLM whose base is held in nf4 (with and without double
// quantization) or fp8 gives, forward and over LoRA steps of a user's own loop (torch::optim::AdamW,
// opt.zero_grad()), what the same model gives whose checkpoint holds the dequantized weights, at 1, 2
// and 3 ranks, for both model forms, on batches that differ by step and by rank; under fsdp() the
// quantized bytes are sharded and at rest between steps; what R21 leaves to the build is refused.
#include "small_models.hpp"
#include "world.hpp"

#include <loom/io/weights.hpp>
#include <loom/loom.hpp>
#include <loom/models/causal_lm.hpp>
#include <loom/nn/deferred_init.hpp>
#include <loom/nn/linear.hpp>
#include <loom/quant/quantized_weight.hpp>

#include <torch/optim/adamw.h>
#include <torch/torch.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <fmt/format.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

using Catch::Matchers::ContainsSubstring;
using loom::testing::causal_lm;
using loom::testing::small_llama;
using loom::testing::world;
namespace fs = std::filesystem;

namespace {

struct SubclassLlama : loom::models::CausalLMImpl {  // the subclass form
  using CausalLMImpl::CausalLMImpl;
};

constexpr int steps = 4;

loom::models::causal_lm_config config() {
  loom::models::causal_lm_config c = small_llama();
  c.hidden_size = 40;  // q_proj's 1600 weights: 25 blocks of 64; gate_proj's 800: 12.5, a partial last block
  c.head_dim = 8;
  c.num_attention_heads = 6;
  c.intermediate_size = 20;
  return c;
}

fs::path folder_of(const std::string& name) {
  return fs::temp_directory_path() / fmt::format("loom-test-quantized-{}-{}", world().world_size(), name);
}

void barrier() {
  at::Tensor token = torch::zeros({1});
  world().comm().all_reduce(token).wait();
}

// The base's checkpoint, and its twin whose linear weights (all but the head) are what `options`
// quantizes them to, dequantized: the weights a quantized base computes with.
void write_checkpoints(const loom::quantized_options& options, const fs::path& base, const fs::path& dequantized) {
  barrier();  // no rank still reads the folders a section before wrote
  if (world().rank() == 0) {
    fs::remove_all(base);
    fs::remove_all(dequantized);
    torch::manual_seed(1);
    loom::models::CausalLM model(config());
    std::vector<loom::named_tensor> plain, twin;
    for (const auto& item : model->named_parameters()) plain.push_back({item.key(), item.value().detach()});
    for (const auto& item : model->named_modules("", false)) {
      auto* linear = item.value()->as<loom::nn::LinearImpl>();
      if (linear == nullptr || item.key() == "lm_head") continue;
      const auto quantized = loom::quant::quantized_weight::quantize(linear->weight, options);
      twin.push_back({item.key() + ".weight", quantized.dequantize(at::kFloat)});
    }
    for (const loom::named_tensor& each : plain) {
      const bool replaced = std::any_of(twin.begin(), twin.end(), [&](const auto& t) { return t.name == each.name; });
      if (!replaced) twin.push_back(each);
    }
    loom::save_weights(base, plain);
    loom::save_weights(dequantized, twin);
  }
  barrier();
}

// Different on every rank and at every step, some labels left out.
std::pair<at::Tensor, at::Tensor> batch(std::int64_t step, int rank) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(500 + 31 * static_cast<std::uint64_t>(step) +
                                                      static_cast<std::uint64_t>(rank));
  const std::int64_t length = step % 2 == 0 ? 9 : 14;
  const at::Tensor ids = torch::randint(64, {2, length}, gen, torch::kLong);
  at::Tensor labels = ids.clone();
  labels.index_put_({step % 2, step % length}, -100);
  return {ids, labels};
}

struct trace {
  at::Tensor logits;
  std::vector<double> losses;
  std::vector<at::Tensor> adapters;
};

// The logits of a first batch, then `steps` LoRA steps of the user's loop.
template <class Job>
trace run(Job& job) {
  trace t;
  {
    const torch::NoGradGuard no_grad;
    t.logits = job.forward(batch(0, job.data_rank()).first).to(at::kFloat);
  }
  torch::optim::AdamW opt(job.trainable_parameters(), torch::optim::AdamWOptions(1e-2));
  for (std::int64_t step = 1; step <= steps; ++step) {
    opt.zero_grad();
    const auto [ids, labels] = batch(step, job.data_rank());
    const at::Tensor loss = loom::models::causal_lm_loss(job.forward(ids), labels);
    job.backward(loss);
    opt.step();
    t.losses.push_back(loss.template item<double>());
  }
  for (const auto& item : causal_lm(job).named_parameters()) {
    if (item.key().find("lora_") != std::string::npos) t.adapters.push_back(item.value().detach().clone());
  }
  return t;
}

template <class M, class Strategy>
void check_against_dequantized(const loom::quantized_options& options, const Strategy& strategy,
                               const std::string& name) {
  const fs::path base = folder_of(name + "-base"), dequantized = folder_of(name + "-dequantized");
  write_checkpoints(options, base, dequantized);
  const auto lora = loom::lora(4, {"q_proj", "v_proj", "gate_proj", "down_proj"}, {.alpha = 8});
  auto quantized_job = loom::build(loom::model<M>(config()) | loom::seeded(3) | loom::pretrained(base.string()) |
                                       loom::quantized_stage::checked(options) | lora | strategy,
                                   world());
  auto reference_job = loom::build(
      loom::model<M>(config()) | loom::seeded(3) | loom::pretrained(dequantized.string()) | lora | strategy, world());
  CHECK_THAT(quantized_job.describe(), ContainsSubstring("quantized: 14 linear layers"));
  const trace got = run(quantized_job);
  const trace expected = run(reference_job);
  CHECK(at::allclose(got.logits, expected.logits, 1e-5, 1e-5));
  for (int i = 0; i < steps; ++i) {
    CAPTURE(i, got.losses[i], expected.losses[i]);
    CHECK(std::abs(got.losses[i] - expected.losses[i]) <= 1e-5 * std::abs(expected.losses[i]));
  }
  REQUIRE(got.adapters.size() == expected.adapters.size());
  for (std::size_t i = 0; i < got.adapters.size(); ++i)
    CHECK(at::allclose(got.adapters[i], expected.adapters[i], 1e-4, 1e-6));
  // The base stayed frozen and quantized: its codes are parameters without gradients.
  for (const auto& item : causal_lm(quantized_job).named_parameters()) {
    if (item.key().ends_with(".weight_codes")) CHECK(!item.value().grad().defined());
  }
}

const loom::quantized_options nf4_double{.format = loom::nf4};
const loom::quantized_options nf4_single{.format = loom::nf4, .double_quant = false};
const loom::quantized_options fp8_row{.format = loom::fp8};
const loom::quantized_options fp8_tensor{.format = loom::fp8, .scaling = loom::fp8_scaling::tensor};

}  // namespace

TEST_CASE("a quantized base computes and trains as its dequantized weights do, under every strategy", "[quantized]") {
  SECTION("fsdp, nf4 with double quantization, the holder form") {
    check_against_dequantized<loom::models::CausalLM>(nf4_double, loom::fsdp(), "fsdp-nf4");
  }
  SECTION("fsdp, fp8 per row, the subclass form") {
    check_against_dequantized<SubclassLlama>(fp8_row, loom::fsdp(), "fsdp-fp8");
  }
  SECTION("ddp, nf4 without double quantization") {
    check_against_dequantized<loom::models::CausalLM>(nf4_single, loom::ddp(), "ddp-nf4");
  }
  SECTION("ddp, fp8 per tensor, the subclass form") {
    check_against_dequantized<SubclassLlama>(fp8_tensor, loom::ddp(), "ddp-fp8");
  }
  if (world().world_size() == 2) {
    SECTION("hybrid sharding: shard groups of one, replicated across two") {
      check_against_dequantized<loom::models::CausalLM>(nf4_double, loom::fsdp({.shard_group_size = 1}), "hsdp");
    }
  }
  if (world().world_size() == 1) {
    SECTION("local") { check_against_dequantized<loom::models::CausalLM>(nf4_double, loom::local(), "local"); }
  }
}

TEST_CASE("under fsdp() the quantized bytes are sharded, and at rest between steps", "[quantized][fsdp]") {
  const fs::path base = folder_of("rest-base"), dequantized = folder_of("rest-dequantized");
  write_checkpoints(nf4_double, base, dequantized);
  auto job =
      loom::build(loom::model<loom::models::CausalLM>(config()) | loom::seeded(3) | loom::pretrained(base.string()) |
                      loom::quantized(loom::nf4) | loom::lora(4) | loom::fsdp(),
                  world());
  (void)run(job);
  std::int64_t codes = 0;
  for (const auto& item : job.module()->named_parameters()) {
    if (!item.key().ends_with(".weight_codes") && !item.key().ends_with(".weight_statistics")) continue;
    CAPTURE(item.key());
    CHECK(item.value().scalar_type() == at::kByte);
    if (world().world_size() > 1) CHECK(!loom::nn::has_bytes(item.value()));
    codes += item.value().numel();
  }
  CHECK(codes > 0);
}

TEST_CASE("what R21 leaves to the build is refused, naming the layer", "[quantized][errors]") {
  const auto base = loom::model<loom::models::CausalLM>(config()) | loom::seeded(3) | loom::quantized(loom::nf4);
  CHECK_THROWS_WITH(
      loom::build(base | loom::lora(4, {"q_proj"}, {.modules_to_save = {"down_proj"}}) | loom::ddp(), world()),
      ContainsSubstring("'model.layers.0.mlp.down_proj.weight' trains") &&
          ContainsSubstring("a quantized weight is frozen (loom R21)"));
}

TEST_CASE("a quantized job saves its base dequantized, merged or not, under the weights' own names",
          "[quantized][files]") {
  const std::string strategy = GENERATE("ddp", "fsdp");
  CAPTURE(strategy);
  const fs::path base = folder_of("save-base"), dequantized = folder_of("save-dequantized");
  const fs::path saved = folder_of("saved-" + strategy), merged = folder_of("merged-" + strategy);
  write_checkpoints(fp8_row, base, dequantized);
  const auto plan = loom::model<loom::models::CausalLM>(config()) | loom::seeded(3) | loom::pretrained(base.string()) |
                    loom::quantized(loom::fp8) | loom::lora(4, {"q_proj", "down_proj"});
  const auto check = [&](auto& job) {
    (void)run(job);  // the adapters move away from zero
    job.save_weights(saved);
    job.merge();
    job.save_pretrained(merged);
    barrier();
    const auto by_name = [](const fs::path& folder) {
      std::map<std::string, at::Tensor> tensors;
      for (loom::named_tensor& t : loom::load_weights(folder)) tensors.emplace(t.name, t.tensor);
      return tensors;
    };
    const auto expected = by_name(dequantized);
    const auto plain = by_name(saved);
    const auto folded = by_name(merged);
    REQUIRE(plain.size() == expected.size());
    REQUIRE(folded.size() == expected.size());
    for (const auto& [name, tensor] : expected) {
      CAPTURE(name);
      REQUIRE(plain.contains(name));
      CHECK(at::equal(plain.at(name), tensor));  // the base alone: exactly the dequantized weights
    }
    // Merged: q_proj and down_proj carry the update (the checkpoint's fp32 kept), the other layers do not.
    const std::string q = "model.layers.1.self_attn.q_proj.weight", k = "model.layers.1.self_attn.k_proj.weight";
    CHECK(!at::allclose(folded.at(q), expected.at(q)));
    CHECK(at::equal(folded.at(k), expected.at(k)));
    // A plain model loads the merged folder and computes what the quantized job computes, merged or not.
    loom::models::CausalLM reloaded(config());
    const std::vector<loom::named_tensor> weights = loom::load_weights(merged);
    (void)loom::copy_weights(*reloaded, weights, /*strict=*/true, nullptr);
    const torch::NoGradGuard no_grad;
    const at::Tensor ids = batch(7, 0).first;
    CHECK(at::allclose(reloaded->forward(ids), job.forward(ids), 1e-5, 1e-5));
  };
  if (strategy == "ddp") {
    auto job = loom::build(plan | loom::ddp(), world());
    check(job);
  } else {
    auto job = loom::build(plan | loom::fsdp(), world());
    check(job);
  }
}

TEST_CASE("a quantized job's local state comes back into a fresh job, as a resume puts it", "[quantized][state]") {
  const std::string strategy = GENERATE("ddp", "fsdp");
  CAPTURE(strategy);
  const fs::path base = folder_of("state-base"), dequantized = folder_of("state-dequantized");
  write_checkpoints(nf4_double, base, dequantized);
  const auto plan = loom::model<loom::models::CausalLM>(config()) | loom::seeded(3) | loom::pretrained(base.string()) |
                    loom::quantized(loom::nf4) | loom::lora(4, {"q_proj", "down_proj"});
  const auto check = [&](auto& trained, auto& fresh) {
    (void)run(trained);
    const loom::tensor_state state = trained.local_state_dict();
    CHECK(std::any_of(state.begin(), state.end(), [](const auto& t) { return t.name.ends_with(".weight_codes"); }));
    fresh.load_local_state_dict(state);
    const torch::NoGradGuard no_grad;
    const at::Tensor ids = batch(9, fresh.data_rank()).first;
    CHECK(at::equal(fresh.forward(ids), trained.forward(ids)));
  };
  if (strategy == "ddp") {
    auto trained = loom::build(plan | loom::ddp(), world());
    auto fresh = loom::build(plan | loom::ddp(), world());
    check(trained, fresh);
  } else {
    auto trained = loom::build(plan | loom::fsdp(), world());
    auto fresh = loom::build(plan | loom::fsdp(), world());
    check(trained, fresh);
  }
}

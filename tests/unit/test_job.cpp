// build() and the job on a single process: seeded construction, LoRA on both linear paths, freezing,
// merge, describe, and the errors a user meets first.
#include <loom/loom.hpp>
#include <loom/precision/attention.hpp>
#include <loom/precision/linear.hpp>
#include <loom/strategies/fsdp/param_group.hpp>
#include <models/mlp.hpp>
#include <models/tiny_gpt.hpp>

#include <catch2/catch_test_macros.hpp>

#include <catch2/matchers/catch_matchers_string.hpp>
#include <cmath>
#include <filesystem>

using Catch::Matchers::ContainsSubstring;

namespace {

constexpr models::tiny_gpt_config small{.vocab = 32, .d = 16, .layers = 2, .heads = 2, .ctx = 8};

template <class Linear>
using Gpt = models::BasicTinyGpt<Linear>;

struct batch {
  at::Tensor x, y;
};

batch tokens(std::uint64_t seed, std::int64_t rows = 4) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return {torch::randint(0, small.vocab, {rows, small.ctx}, gen),
          torch::randint(0, small.vocab, {rows, small.ctx}, gen)};
}

loom::runtime one() { return loom::runtime::single_process(); }

// Gives every adapter a non-zero B, the same on any model built from the same seed.
void randomise_adapters(torch::nn::Module& module) {
  torch::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  for (auto& p : module.named_parameters()) {
    if (p.key().ends_with("lora_B")) p.value().copy_(torch::randn(p.value().sizes(), gen) * 0.1);
  }
}

std::map<std::string, at::Tensor> gradients_by_name(torch::nn::Module& module) {
  std::map<std::string, at::Tensor> grads;
  for (auto& p : module.named_parameters()) {
    if (p.value().grad().defined()) grads[p.key()] = p.value().grad().clone();
  }
  return grads;
}

struct frozen_mlp : models::Mlp {
  frozen_mlp() : models::Mlp(8, 2) {
    for (auto& p : parameters()) p.set_requires_grad(false);
  }
};

}  // namespace

TEST_CASE("seeded construction leaves the caller's generator as it was", "[seeded]") {
  torch::manual_seed(7);
  auto expected = torch::rand({8});
  torch::manual_seed(7);
  auto job = loom::build(loom::model<Gpt<loom::nn::Linear>>(small) | loom::seeded(3), one());
  CHECK(torch::equal(torch::rand({8}), expected));
}

TEST_CASE("seeded construction is reproducible and seed-dependent", "[seeded]") {
  auto a = loom::build(loom::model<Gpt<loom::nn::Linear>>(small) | loom::seeded(3), one());
  auto b = loom::build(loom::model<Gpt<loom::nn::Linear>>(small) | loom::seeded(3), one());
  auto c = loom::build(loom::model<Gpt<loom::nn::Linear>>(small) | loom::seeded(4), one());
  CHECK(torch::equal(a.module().head->weight, b.module().head->weight));
  CHECK_FALSE(torch::equal(a.module().head->weight, c.module().head->weight));
}

TEST_CASE("loom::nn::Linear is a drop-in for torch::nn::Linear", "[nn]") {
  auto fast = loom::build(loom::model<Gpt<loom::nn::Linear>>(small) | loom::seeded(9), one());
  auto plain = loom::build(loom::model<Gpt<torch::nn::Linear>>(small) | loom::seeded(9), one());
  auto fast_params = fast.module().named_parameters();
  auto plain_params = plain.module().named_parameters();
  REQUIRE(fast_params.keys() == plain_params.keys());
  for (const auto& name : fast_params.keys()) CHECK(torch::equal(fast_params[name], plain_params[name]));
  auto [x, y] = tokens(1);
  CHECK(torch::equal(fast.forward(x, y), plain.forward(x, y)));
}

namespace {

struct linear_operands {
  at::Tensor input, weight, bias;
};

// Odd sizes, so that a transposed or misshapen product cannot pass; requires_grad on all three.
linear_operands bf16_operands(std::uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto bf16 = torch::TensorOptions(torch::kBFloat16);
  return {torch::randn({3, 5, 33}, gen).to(bf16).requires_grad_(),
          torch::randn({17, 33}, gen).to(bf16).requires_grad_(), torch::randn({17}, gen).to(bf16).requires_grad_()};
}

// The output and the three gradients of sum(linear(...) * probe).
std::vector<at::Tensor> linear_and_grads(const linear_operands& operands, bool with_loom) {
  const auto& [input, weight, bias] = operands;
  for (const auto& each : {input, weight, bias}) each.mutable_grad() = at::Tensor();
  const at::Tensor output = with_loom ? loom::linear(input, weight, bias) : at::linear(input, weight, bias);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  (output.to(torch::kFloat) * torch::randn(output.sizes(), gen)).sum().backward();
  return {output.detach(), input.grad(), weight.grad(), bias.grad()};
}

}  // namespace

TEST_CASE("loom::linear in bf16 equals ATen's bf16 linear: products summed in fp32, rounded once", "[nn][precision]") {
  const auto operands = bf16_operands(21);
  const auto ours = linear_and_grads(operands, true);
  const auto aten = linear_and_grads(operands, false);
  for (std::size_t i = 0; i < ours.size(); ++i) {
    INFO("output, then the gradients of input, weight and bias: " << i);
    CHECK(ours[i].scalar_type() == torch::kBFloat16);
    CHECK(ours[i].sizes() == aten[i].sizes());
    // The order of the fp32 sums may differ: one bf16 rounding step apart at most.
    CHECK(torch::allclose(ours[i].to(torch::kFloat), aten[i].to(torch::kFloat), /*rtol=*/1.0 / 128, /*atol=*/1e-6));
  }
  if (!loom::uses_aten_bf16_products()) {
    // Through the fp32 GEMM: exactly the fp32 product of the bf16 values, rounded.
    const auto& [input, weight, bias] = operands;
    const at::Tensor wide = at::linear(input.to(torch::kFloat), weight.to(torch::kFloat), bias.to(torch::kFloat));
    CHECK(torch::equal(ours[0], wide.detach().to(torch::kBFloat16)));
  }
}

TEST_CASE("loom::linear under autocast rounds its operands to bf16 and trains the fp32 leaves", "[nn][precision]") {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(8);
  const at::Tensor input = torch::randn({4, 9}, gen);
  const at::Tensor weight = torch::randn({6, 9}, gen).requires_grad_();
  at::Tensor ours, aten;
  {
    const loom::autocast_scope autocast(c10::DeviceType::CPU, torch::kBFloat16);
    ours = loom::linear(input, weight);
    aten = at::linear(input, weight);
  }
  CHECK(ours.scalar_type() == torch::kBFloat16);
  CHECK(torch::allclose(ours.to(torch::kFloat), aten.to(torch::kFloat), 1.0 / 128, 1e-6));
  ours.to(torch::kFloat).sum().backward();
  const at::Tensor ours_grad = weight.grad().clone();
  weight.mutable_grad() = at::Tensor();
  aten.to(torch::kFloat).sum().backward();
  CHECK(ours_grad.scalar_type() == torch::kFloat);
  CHECK(torch::allclose(ours_grad, weight.grad(), 1.0 / 128, 1e-6));
}

TEST_CASE("loom::linear leaves fp32 and a frozen bf16 weight as ATen has them", "[nn][precision]") {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(4);
  const at::Tensor input = torch::randn({2, 7}, gen).requires_grad_();
  const at::Tensor weight = torch::randn({3, 7}, gen);
  CHECK(torch::equal(loom::linear(input, weight), at::linear(input, weight)));

  const at::Tensor frozen = weight.to(torch::kBFloat16);
  const at::Tensor narrow_input = input.detach().to(torch::kBFloat16).requires_grad_();
  loom::linear(narrow_input, frozen).to(torch::kFloat).sum().backward();
  CHECK_FALSE(frozen.grad().defined());
  REQUIRE(narrow_input.grad().defined());
  CHECK(narrow_input.grad().scalar_type() == torch::kBFloat16);
}

namespace {

struct attention_case {
  const char* name = "";
  std::optional<at::Tensor> mask = std::nullopt;
  bool causal = false;
  std::optional<double> scale = std::nullopt;
};

// [2 batches, 3 heads, 40 queries, 16 channels] in bf16 against 24 keys (cross-attention) or 40 (self).
std::vector<at::Tensor> attention_and_grads(const attention_case& each, std::int64_t keys, bool with_loom) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(31);
  std::vector<at::Tensor> operands;
  for (const std::int64_t tokens : {std::int64_t{40}, keys, keys}) {
    operands.push_back(torch::randn({2, 3, tokens, 16}, gen).to(torch::kBFloat16).requires_grad_());
  }
  const auto& q = operands[0];
  const auto& k = operands[1];
  const auto& v = operands[2];
  const at::Tensor output = with_loom
                                ? loom::scaled_dot_product_attention(q, k, v, each.mask, each.causal, each.scale)
                                : at::scaled_dot_product_attention(q, k, v, each.mask, 0.0, each.causal, each.scale);
  (output.to(torch::kFloat) * torch::randn(output.sizes(), gen)).sum().backward();
  return {output.detach(), q.grad(), k.grad(), v.grad()};
}

}  // namespace

TEST_CASE("loom::scaled_dot_product_attention in bf16 equals ATen's, and the fp32 kernel's where it widens",
          "[nn][precision]") {
  const at::Tensor positions = torch::arange(40);
  const at::Tensor behind = positions.unsqueeze(1) - positions.unsqueeze(0);
  const std::vector<attention_case> cases = {
      {.name = "self-attention, causal", .causal = true},
      {.name = "cross-attention", .scale = 0.3},
      {.name = "a sliding window of 5 (a boolean mask)", .mask = behind.ge(0).logical_and(behind.lt(5))},
      {.name = "an additive mask", .mask = torch::randn({40, 40}).to(torch::kBFloat16)},
  };
  for (const attention_case& each : cases) {
    const std::int64_t keys = each.scale ? 24 : 40;
    const auto ours = attention_and_grads(each, keys, true);
    const auto aten = attention_and_grads(each, keys, false);
    for (std::size_t i = 0; i < ours.size(); ++i) {
      INFO(each.name << ": the output, then the gradients of query, key and value: " << i);
      CHECK(ours[i].scalar_type() == torch::kBFloat16);
      CHECK(ours[i].sizes() == aten[i].sizes());
      // ATen's bf16 kernel rounds the probabilities to bf16 before the values multiply them.
      CHECK(torch::allclose(ours[i].to(torch::kFloat), aten[i].to(torch::kFloat), /*rtol=*/2.0 / 128, /*atol=*/2e-2));
    }
    if (!loom::uses_aten_bf16_products()) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(31);
      std::vector<at::Tensor> wide;
      for (const std::int64_t tokens : {std::int64_t{40}, keys, keys}) {
        wide.push_back(torch::randn({2, 3, tokens, 16}, gen).to(torch::kBFloat16).to(torch::kFloat));
      }
      const std::optional<at::Tensor> mask = each.mask && each.mask->scalar_type() != torch::kBool
                                                 ? std::optional(each.mask->to(torch::kFloat))
                                                 : each.mask;
      const at::Tensor expected =
          at::scaled_dot_product_attention(wide[0], wide[1], wide[2], mask, 0.0, each.causal, each.scale);
      INFO(each.name);
      CHECK(torch::equal(ours[0], expected.to(torch::kBFloat16)));
    }
  }
}

TEST_CASE("loom::scaled_dot_product_attention leaves fp32 to ATen, and rounds to bf16 under autocast",
          "[nn][precision]") {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
  const at::Tensor q = torch::randn({1, 2, 8, 4}, gen);
  const at::Tensor k = torch::randn({1, 2, 8, 4}, gen).requires_grad_();
  const at::Tensor v = torch::randn({1, 2, 8, 4}, gen);
  CHECK(torch::equal(loom::scaled_dot_product_attention(q, k, v, std::nullopt, true),
                     at::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, true)));
  at::Tensor ours, aten;
  {
    const loom::autocast_scope autocast(c10::DeviceType::CPU, torch::kBFloat16);
    ours = loom::scaled_dot_product_attention(q, k, v);
    aten = at::scaled_dot_product_attention(q, k, v);
  }
  CHECK(ours.scalar_type() == torch::kBFloat16);
  CHECK(torch::allclose(ours.to(torch::kFloat), aten.to(torch::kFloat), 4.0 / 128, 2e-2));
  ours.to(torch::kFloat).sum().backward();
  REQUIRE(k.grad().defined());
  CHECK(k.grad().scalar_type() == torch::kFloat);  // the fp32 leaf trains in fp32
}

TEST_CASE("right after build, a LoRA model computes exactly what its base does", "[lora]") {
  auto [x, y] = tokens(2);
  auto base = loom::build(loom::model<Gpt<loom::nn::Linear>>(small) | loom::seeded(11), one());
  auto fast = loom::build(loom::model<Gpt<loom::nn::Linear>>(small) | loom::seeded(11) | loom::lora(4), one());
  auto plain = loom::build(loom::model<Gpt<torch::nn::Linear>>(small) | loom::seeded(11) | loom::lora(4), one());
  const auto expected = base.forward(x, y);
  CHECK(torch::equal(fast.forward(x, y), expected));
  CHECK(torch::equal(plain.forward(x, y), expected));
  CHECK(torch::equal(fast.module().logits(x), base.module().logits(x)));
}

TEST_CASE("the fast path and the fallback give the same outputs and gradients", "[lora]") {
  auto [x, y] = tokens(3);
  constexpr auto plan_tail = loom::seeded(12) | loom::lora(4, {"q_proj", "v_proj", "fc_in"}, {.alpha = 6.0});
  auto fast = loom::build(loom::model<Gpt<loom::nn::Linear>>(small) | plan_tail, one());
  auto plain = loom::build(loom::model<Gpt<torch::nn::Linear>>(small) | plan_tail, one());
  randomise_adapters(fast.module());
  randomise_adapters(plain.module());
  auto fast_loss = fast.forward(x, y);
  auto plain_loss = plain.forward(x, y);
  CHECK(torch::allclose(fast_loss, plain_loss, 1e-5, 1e-6));
  fast.backward(fast_loss);
  plain.backward(plain_loss);
  auto fast_grads = gradients_by_name(fast.module());
  auto plain_grads = gradients_by_name(plain.module());
  REQUIRE(fast_grads.size() == 12);  // lora_A and lora_B of 3 layers in 2 blocks, nothing else
  for (const auto& [name, grad] : fast_grads) {
    CAPTURE(name);
    REQUIRE(plain_grads.contains(name));
    CHECK(torch::allclose(grad, plain_grads[name], 1e-4, 1e-6));
  }
}

TEST_CASE("adapters start as PEFT's: A kaiming-uniform, B zero, scaling alpha / rank", "[lora]") {
  auto job = loom::build(
      loom::model<Gpt<loom::nn::Linear>>(small) | loom::seeded(1) | loom::lora(4, {"q_proj"}, {.alpha = 2.0}), one());
  auto& q = *job.module().blocks[0]->as<models::BlockImpl<loom::nn::Linear>>()->attn->q_proj;
  REQUIRE(q.adapter().has_value());
  CHECK(q.adapter()->scaling == 0.5);
  CHECK(q.lora_A.sizes() == at::IntArrayRef{4, small.d});
  CHECK(q.lora_B.sizes() == at::IntArrayRef{small.d, 4});
  CHECK(q.lora_B.abs().max().item<float>() == 0.0f);
  const double bound = 1.0 / std::sqrt(static_cast<double>(small.d));  // gain √(1/3) · √(3 / fan_in)
  CHECK(q.lora_A.abs().max().item<double>() <= bound);
  CHECK(q.lora_A.abs().max().item<double>() > bound / 2);
}

TEST_CASE("LoRA freezes all but the adapters, and trainable(...) keeps more", "[lora]") {
  auto adapters_only = loom::build(loom::model<Gpt<loom::nn::Linear>>(small) | loom::lora(4, {"v_proj"}), one());
  for (auto& p : adapters_only.module().named_parameters()) {
    CAPTURE(p.key());
    CHECK(p.value().requires_grad() == (p.key().ends_with("lora_A") || p.key().ends_with("lora_B")));
  }
  CHECK(adapters_only.trainable_parameters().size() == 4);

  auto with_head = loom::build(
      loom::model<Gpt<loom::nn::Linear>>(small) | loom::lora(4, {"v_proj"}) | loom::trainable({"head", "ln_f"}), one());
  CHECK(with_head.trainable_parameters().size() == 8);
  CHECK(with_head.module().head->weight.requires_grad());
  CHECK_FALSE(with_head.module().tok->weight.requires_grad());
}

TEST_CASE("targets match a name, its dotted ending, or a whole regex; exclude matches the same way", "[lora]") {
  auto count = [](auto plan) {
    return loom::build(plan, loom::runtime::single_process()).trainable_parameters().size() / 2;
  };
  using M = Gpt<loom::nn::Linear>;
  CHECK(count(loom::model<M>(small) | loom::lora(2, {"attn.q_proj"})) == 2);
  CHECK(count(loom::model<M>(small) | loom::lora(2, {"blocks.1.attn.q_proj"})) == 1);
  CHECK(count(loom::model<M>(small) | loom::lora(2, {loom::pattern("blocks\\.1\\.attn\\..*_proj")})) == 4);
  CHECK(count(loom::model<M>(small) | loom::lora(2, loom::default_targets, {.exclude = {"blocks.0.attn.k_proj"}})) ==
        7);
}

TEST_CASE("merge folds the adapters in, unmerge takes them out", "[lora]") {
  // References, not a structured binding: clang before 16 (scripts/test --sanitize) cannot capture one.
  const batch b = tokens(4);
  const at::Tensor& x = b.x;
  const at::Tensor& y = b.y;
  auto check = [&](auto job) {
    randomise_adapters(job.module());
    const auto unmerged = job.forward(x, y).detach();
    const auto weight = job.module().head->weight.clone();
    job.merge();
    CHECK(torch::allclose(job.forward(x, y), unmerged, 1e-5, 1e-6));
    CHECK_FALSE(torch::allclose(job.module().head->weight, weight));
    job.unmerge();
    CHECK(torch::allclose(job.module().head->weight, weight, 0, 1e-6));
    CHECK(torch::allclose(job.forward(x, y), unmerged, 1e-5, 1e-6));
  };
  SECTION("fast path") {
    check(loom::build(loom::model<Gpt<loom::nn::Linear>>(small) | loom::seeded(2) | loom::lora(4, {"head"}), one()));
  }
  SECTION("fallback") {
    check(loom::build(loom::model<Gpt<torch::nn::Linear>>(small) | loom::seeded(2) | loom::lora(4, {"head"}), one()));
  }
}

TEST_CASE("lora dropout applies to the adapter branch's input only", "[lora]") {
  auto [x, y] = tokens(5);
  auto base = loom::build(loom::model<Gpt<loom::nn::Linear>>(small) | loom::seeded(6), one());
  auto job = loom::build(loom::model<Gpt<loom::nn::Linear>>(small) | loom::seeded(6) |
                             loom::lora(4, loom::default_targets, {.dropout = 0.5}),
                         one());
  // Training mode, B still zero: dropout on the base path would change the output.
  CHECK(torch::equal(job.forward(x, y), base.forward(x, y)));
  randomise_adapters(job.module());
  CHECK_FALSE(torch::equal(job.forward(x, y), job.forward(x, y)));  // the adapter's input is dropped at random
  job.module().eval();
  CHECK(torch::equal(job.forward(x, y), job.forward(x, y)));
}

TEST_CASE("a target that matches nothing lists the linear layers that exist", "[lora][errors]") {
  CHECK_THROWS_WITH(loom::build(loom::model<Gpt<loom::nn::Linear>>(small) | loom::lora(4, {"query"}), one()),
                    ContainsSubstring("lora(targets=[query]) matched no layer") &&
                        ContainsSubstring("'query' names none of its linear layers, which are "
                                          "blocks.0.attn.q_proj, blocks.0.attn.k_proj") &&
                        ContainsSubstring("and 1 more; name one of them, the end of its dotted name (e.g. 'q_proj'), "
                                          "or a loom::pattern(\"regex\")") &&
                        !ContainsSubstring("did you mean"));
}

TEST_CASE("a misspelt target is an exception that names the layers it is close to", "[lora][errors]") {
  // As a user's main() meets it: under fsdp(), as under any strategy, build() throws what it refuses,
  // for main() to catch (the recipes say it in one line and exit 1).
  const auto misspelt = [] {
    (void)loom::build(loom::model<models::TinyGpt>(small) | loom::seeded(1) | loom::lora(8, {"q_prj"}) | loom::fsdp(),
                      one());
  };
  CHECK_THROWS_AS(misspelt(), std::invalid_argument);
  CHECK_THROWS_WITH(misspelt(), ContainsSubstring("lora(targets=[q_prj]) matched no layer of models::BasicTinyGpt") &&
                                    ContainsSubstring(": 'q_prj' (did you mean 'q_proj'?) names none of its linear "
                                                      "layers, which are blocks.0.attn.q_proj"));
  // Each target, with its own; a dotted ending is offered as a dotted ending.
  CHECK_THROWS_WITH(
      loom::build(loom::model<Gpt<loom::nn::Linear>>(small) | loom::lora(4, {"attn.v_prj", "fc_ot"}), one()),
      ContainsSubstring("'attn.v_prj' (did you mean 'attn.v_proj', ") &&
          ContainsSubstring("and 'fc_ot' (did you mean 'fc_out'?) name none of its linear layers"));
}

TEST_CASE("a target that selects a module that is not linear is named with its type", "[lora][errors]") {
  CHECK_THROWS_WITH(
      loom::build(loom::model<Gpt<loom::nn::Linear>>(small) | loom::lora(4, {"blocks.0.attn"}), one()),
      ContainsSubstring("selects 'blocks.0.attn', a models::AttentionImpl") && ContainsSubstring("not a linear layer"));
  CHECK_THROWS_WITH(loom::build(loom::model<Gpt<loom::nn::Linear>>(small) | loom::lora(4, {"ln1"}), one()),
                    ContainsSubstring("'blocks.0.ln1', a torch::nn::LayerNormImpl"));
}

TEST_CASE("dropout on the torch::nn::Linear fallback is refused with the fix", "[lora][errors]") {
  CHECK_THROWS_WITH(
      loom::build(loom::model<Gpt<torch::nn::Linear>>(small) | loom::lora(4, {"q_proj"}, {.dropout = 0.1}), one()),
      ContainsSubstring("needs loom::nn::Linear") && ContainsSubstring("set dropout to 0"));
}

TEST_CASE("ddp() with no trainable parameter says so and names the fix", "[ddp][errors]") {
  CHECK_THROWS_WITH(loom::build(loom::model<frozen_mlp>() | loom::ddp(), one()),
                    ContainsSubstring("ddp(): the plan leaves no trainable parameter"));
}

TEST_CASE("describe() is the plan plus what the build decided", "[job]") {
  auto job = loom::build(loom::model<Gpt<torch::nn::Linear>>(small) | loom::seeded(1) | loom::lora(4, {"q_proj"}) |
                             loom::trainable({"head"}),
                         one());
  const std::string text = job.describe();
  CHECK_THAT(text, ContainsSubstring("seeded(1)"));
  CHECK_THAT(text, ContainsSubstring("lora adapted 2 layers (0 on the loom::nn::Linear fast path, 2 on the "
                                     "torch::nn::Linear fallback)"));
  CHECK_THAT(text, ContainsSubstring("trainable (6 tensors)"));
  CHECK_THAT(text, ContainsSubstring("schedule 0 collectives a step"));
  CHECK(job.schedule().empty());
}

TEST_CASE("the job trains: loss goes down with the optimizer over trainable_parameters()", "[job]") {
  auto job = loom::build(loom::model<Gpt<loom::nn::Linear>>(small) | loom::seeded(1) | loom::lora(4), one());
  torch::optim::AdamW optimizer(job.trainable_parameters(), torch::optim::AdamWOptions(1e-2));
  auto [x, y] = tokens(8);
  double first = 0, last = 0;
  for (int step = 0; step < 20; ++step) {
    auto loss = job.forward(x, y);
    job.backward(loss);
    CHECK(job.clip_grad_norm(1.0).item<double>() > 0);
    optimizer.step();
    optimizer.zero_grad();
    (step == 0 ? first : last) = loss.item<double>();
  }
  CHECK(last < first);
}

// The norm still converts to 0.1.0's double (deprecated; tests/compat/old_names.cpp), which must not
// make an expression of it with a number ambiguous, nor read it on the host.
TEST_CASE("clip_grad_norm's norm is a tensor in arithmetic and comparisons with numbers", "[job][clip]") {
  auto job = loom::build(loom::model<Gpt<loom::nn::Linear>>(small) | loom::seeded(1), one());
  auto [x, y] = tokens(8);
  job.backward(job.forward(x, y));
  const loom::host_read_counts before = job.rt().progress().host_reads();
  const auto norm = job.clip_grad_norm(1e9);
  const at::Tensor shifted = 1 + norm - 1, scaled = norm * 2 / 2, above = norm > 0, below = 0.0 >= norm;
  CHECK(job.rt().progress().host_reads() == before);
  const double value = norm.item<double>();
  CHECK(value > 0);
  CHECK(std::abs(shifted.item<double>() - value) <= 1e-6 * (1 + value));
  CHECK(scaled.item<double>() == value);
  CHECK(above.item<bool>());
  CHECK_FALSE(below.item<bool>());
}

TEST_CASE("describe() counts in one voice and spells the model's type as the plan does", "[job]") {
  auto job = loom::build(loom::model<Gpt<loom::nn::Linear>>(small) | loom::seeded(1) | loom::lora(4, {"head"}), one());
  const std::string text = job.describe();
#ifdef __clang__
  const std::string name = "models::BasicTinyGpt<>";  // clang's __PRETTY_FUNCTION__ leaves out a default argument
#else
  const std::string name = "models::BasicTinyGpt<loom::nn::Linear>";
#endif
  CHECK_THAT(text,
             ContainsSubstring("model<" + name + ">(1 arg)") && ContainsSubstring("build: " + name + " on 1 rank"));
  CHECK_THAT(text, ContainsSubstring("on 1 rank, device cpu"));
  CHECK_THAT(text, ContainsSubstring("lora adapted 1 layer (1 on"));
  CHECK_THAT(text, ContainsSubstring("trainable (2 tensors)"));
}

TEST_CASE("state_dict() holds every parameter and buffer; load_state_dict() restores them and names a mismatch",
          "[job][state]") {
  auto a = loom::build(loom::model<Gpt<loom::nn::Linear>>(small) | loom::seeded(1) | loom::lora(4), one());
  auto b = loom::build(loom::model<Gpt<loom::nn::Linear>>(small) | loom::seeded(2) | loom::lora(4), one());
  randomise_adapters(a.module());
  const loom::tensor_state state = a.state_dict();
  const auto expected = a.module().named_parameters().size() + a.module().named_buffers().size();
  CHECK(state.size() == expected);
  CHECK(state.front().name == "tok.weight");

  b.load_state_dict(state);
  auto [x, y] = tokens(6);
  CHECK(torch::equal(b.forward(x, y), a.forward(x, y)));

  loom::tensor_state missing(state.begin() + 1, state.end());
  CHECK_THROWS_WITH(b.load_state_dict(missing), ContainsSubstring("the state has no tensor 'tok.weight'"));
  loom::tensor_state reshaped = state;
  reshaped.front().tensor = reshaped.front().tensor.reshape({-1});
  CHECK_THROWS_WITH(b.load_state_dict(reshaped),
                    ContainsSubstring("'tok.weight' is Float[512] in the state but Float[32,16] in the module"));
  loom::tensor_state extra = state;
  extra.push_back({"extra.weight", at::zeros({1})});
  CHECK_THROWS_WITH(b.load_state_dict(extra), ContainsSubstring("a tensor 'extra.weight' that the module lacks"));
}

namespace {

// Two units that share one parameter: the second registers the first's weight under a name of its own.
struct tied_units : torch::nn::Module {
  using Block = loom::nn::Unit<models::BasicMlp<loom::nn::Linear>>;
  tied_units() : blocks(register_module("blocks", torch::nn::ModuleList())) {
    auto first = std::make_shared<Block>(4, 1);
    auto second = std::make_shared<Block>(4, 1);
    second->register_parameter("tied", first->layers[0]->as<loom::nn::LinearImpl>()->weight);
    blocks->push_back(first);
    blocks->push_back(second);
  }
  at::Tensor forward(at::Tensor x) {
    for (auto& block : *blocks) x = block->as<Block>()->forward(x);
    return x;
  }
  torch::nn::ModuleList blocks;
};

}  // namespace

TEST_CASE("fsdp on one rank: a model without units is all root, and describe() names the candidates", "[fsdp]") {
  auto job = loom::build(loom::model<models::Mlp>(8, 3) | loom::seeded(1) | loom::fsdp(), one());
  CHECK_THAT(job.describe(), ContainsSubstring("fsdp: no unit: the whole model is the root") &&
                                 ContainsSubstring("the children of layers could be units"));
  auto x = torch::randn({2, 8});
  auto reference = loom::build(loom::model<models::Mlp>(8, 3) | loom::seeded(1), one());
  CHECK(torch::allclose(job.forward(x), reference.forward(x)));
}

TEST_CASE("fsdp(offload=true) on a CPU device is refused with a sentence naming the fix", "[fsdp][errors]") {
  // The same message whether the model is built without its bytes (loom::nn's layers) or whole.
  CHECK_THROWS_WITH(
      loom::build(loom::model<Gpt<loom::nn::Linear>>(small) | loom::seeded(1) | loom::fsdp({.offload = true}), one()),
      "loom: fsdp(offload=true) moves the shards, their gradients and the optimizer's state to host memory, and "
      "this job's device is the CPU already: leave offload out (or run on a GPU)");
  CHECK_THROWS_WITH(loom::build(loom::model<models::Mlp>(8, 3) | loom::fsdp({.offload = true}), one()),
                    ContainsSubstring("leave offload out (or run on a GPU)"));
  // Without it, the same plan builds.
  CHECK_NOTHROW(loom::build(loom::model<models::Mlp>(8, 3) | loom::fsdp({.offload = false}), one()));
}

TEST_CASE("fsdp refuses a parameter shared by two units, naming it and both owners", "[fsdp][errors]") {
  CHECK_THROWS_WITH(loom::build(loom::model<tied_units>() | loom::fsdp(), one()),
                    ContainsSubstring("parameter 'blocks.1.tied' is shared by blocks.0 and blocks.1"));
}

TEST_CASE("fsdp no_sync: accumulated micro-batches reduce to one big batch's gradient", "[fsdp][no_sync]") {
  auto reference = loom::build(loom::model<Gpt<loom::nn::Linear>>(small) | loom::seeded(3), one());
  auto sharded = loom::build(loom::model<Gpt<loom::nn::Linear>>(small) | loom::seeded(3) | loom::fsdp(), one());
  auto [x0, y0] = tokens(10);
  auto [x1, y1] = tokens(11);
  reference.backward(reference.forward(x0, y0));
  reference.backward(reference.forward(x1, y1));
  {
    auto accumulate = sharded.no_sync();
    sharded.backward(sharded.forward(x0, y0));
  }
  sharded.backward(sharded.forward(x1, y1));
  const auto expected = reference.trainable_parameters();
  const auto actual = sharded.trainable_parameters();
  REQUIRE(actual.size() == expected.size());
  for (std::size_t i = 0; i < actual.size(); ++i) {
    CHECK(torch::allclose(actual[i].grad().view(-1), expected[i].grad().view(-1), 1e-5, 1e-6));
  }
}

namespace {

// An Mlp whose constructor loads its weights from an archive: LibTorch gives such parameters a
// storage it cannot resize.
struct loaded_mlp : models::Mlp {
  explicit loaded_mlp(const std::string& file) : models::Mlp(8, 2) {
    torch::serialize::InputArchive archive;
    archive.load_from(file);
    load(archive);
  }
};

}  // namespace

TEST_CASE("fsdp shards parameters loaded from an archive", "[fsdp]") {
  const std::string file = (std::filesystem::temp_directory_path() / "loom-test-loaded-mlp.pt").string();
  auto saved = loom::build(loom::model<models::Mlp>(8, 2) | loom::seeded(4), one());
  {
    torch::serialize::OutputArchive archive;
    saved.module().save(archive);
    archive.save_to(file);
  }
  auto job = loom::build(loom::model<loaded_mlp>(file) | loom::fsdp(), one());
  auto x = torch::randn({3, 8});
  CHECK(torch::equal(job.forward(x), saved.forward(x)));
  std::filesystem::remove(file);
}

TEST_CASE("an fsdp group moves between its states only as the table allows", "[job][fsdp]") {
  using loom::sharding::after;
  using loom::sharding::group_move;
  using loom::sharding::group_state;
  using loom::sharding::may_start;
  // A gather from either state leaves the group whole; a reshard or coming to rest leaves it sharded.
  for (const group_state from : {group_state::unsharded, group_state::sharded}) {
    CHECK(may_start(group_move::gather, from));
    CHECK(may_start(group_move::reshard, from));
    CHECK(may_start(group_move::hold_masters, from));
    CHECK_FALSE(may_start(group_move::release_masters, from));
  }
  STATIC_REQUIRE(after(group_move::gather) == group_state::unsharded);
  STATIC_REQUIRE(after(group_move::reshard) == group_state::sharded);
  STATIC_REQUIRE(after(group_move::come_to_rest) == group_state::sharded);
  // Holding the masters (with_whole_module): nothing but their release, which leaves the group sharded.
  STATIC_REQUIRE(after(group_move::hold_masters) == group_state::holding_masters);
  for (const group_move move :
       {group_move::gather, group_move::reshard, group_move::come_to_rest, group_move::hold_masters})
    CHECK_FALSE(may_start(move, group_state::holding_masters));
  CHECK(may_start(group_move::release_masters, group_state::holding_masters));
  STATIC_REQUIRE(after(group_move::release_masters) == group_state::sharded);
}

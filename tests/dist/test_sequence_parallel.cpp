// sequence_parallel(k) across real processes, at 2, 3 and 4 ranks: Llama (both model forms), Gemma 3's
// sliding-window layers and Wan
// under ddp(), fsdp() and (at 4 ranks) hybrid sharding, with LoRA, recompute and bf16, against the same plan without
// the stage on the same ranks reading the same batches: every step's loss and every gradient within fp32 rounding
// (bf16's bound under mixed precision), ten steps ending in the same state; the schedule's all-to-alls; and the errors
// a user meets.
#include "same_state.hpp"
#include "small_models.hpp"
#include "world.hpp"

#include <loom/loom.hpp>
#include <loom/models/causal_lm.hpp>
#include <loom/models/wan.hpp>
#include <loom/nn/sequence_parallel.hpp>
#include <loom/runtime/sequence_group.hpp>

#include <torch/torch.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <fmt/format.h>

#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

using Catch::Matchers::ContainsSubstring;
using loom::testing::difference;
using loom::testing::world;

namespace {

// k: the whole world at 2 and 3 ranks, and 2 sequence × 2 data-parallel ranks at 4.
int group_size() { return world().world_size() == 4 ? 2 : world().world_size(); }

// Hybrid sharding at 4 ranks: shards across {0, 1} and {2, 3}, replicas across {0, 2} and {1, 3},
// so the shard groups are the sequence groups and the replicas cross them.
bool hybrid_world() { return world().world_size() == 4; }
loom::fsdp_stage hybrid() { return loom::fsdp({.shard_group_size = 2}); }

loom::models::causal_lm_config small_llama() {
  loom::models::causal_lm_config config;
  config.vocab_size = 64;
  config.hidden_size = 48;
  config.intermediate_size = 40;
  config.num_hidden_layers = 3;
  config.num_attention_heads = 6;  // k = 2 and 3 divide it
  config.num_key_value_heads = 2;  // k = 2 divides it; k = 3 does not, so they are repeated
  config.head_dim = 8;
  return config;
}

// Gemma 3's structure (q and k norms, sandwich norms, scaled embeddings, GELU, soft-capping) with a
// local layer, in a window shorter than the sequences, on each side of a global one: the windowed
// mask is the whole sequence's, after the exchange.
loom::models::causal_lm_config small_gemma() {
  return loom::testing::small_family(loom::models::causal_lm_family::gemma3, small_llama());
}

loom::models::wan_config small_wan() {
  loom::models::wan_config config;
  config.num_attention_heads = 6;
  config.attention_head_dim = 12;
  config.in_channels = 4;
  config.out_channels = 4;
  config.text_dim = 16;
  config.freq_dim = 16;
  config.ffn_dim = 40;
  config.num_layers = 3;
  config.rope_max_seq_len = 32;
  return config;
}

struct SubclassLlama : loom::models::CausalLMImpl {  // the subclass form
  using CausalLMImpl::CausalLMImpl;
};

// The batch of data-parallel rank `data_rank` at `step`: its length varies by step (12 or 24 tokens,
// which 2, 3 and 4 divide), its values by step and data rank.
at::Tensor token_batch(int step, int data_rank) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + 37 * static_cast<std::uint64_t>(step) +
                                                      static_cast<std::uint64_t>(data_rank));
  const std::int64_t length = step % 2 == 0 ? 12 : 24;
  at::Tensor ids = torch::randint(64, {2, length}, gen, torch::kLong);
  return ids;
}

// Labels as a causal LM takes them, some left out (-100), at other places each step.
at::Tensor labels_of(const at::Tensor& ids, int step) {
  at::Tensor labels = ids.clone();
  labels.index_put_({0, (step * 5) % ids.size(1)}, -100);
  labels.index_put_({1, (step * 7 + 3) % ids.size(1)}, -100);
  return labels;
}

struct video_batch {
  at::Tensor latents, timestep, text, target;
};

// Latents of 3 or 6 frames of 4 × 4 (12 or 24 tokens after 1 × 2 × 2 patches); every third step a
// timestep a token (Wan 2.2 TI2V's expand_timesteps), each token its own, which a rank's tokens take
// with them.
video_batch wan_batch(int step, int data_rank) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5000 + 37 * static_cast<std::uint64_t>(step) +
                                                      static_cast<std::uint64_t>(data_rank));
  const std::int64_t frames = step % 2 == 0 ? 3 : 6;
  const at::Tensor latents = torch::randn({2, 4, frames, 4, 4}, gen);
  const std::vector<std::int64_t> timesteps =
      step % 3 == 2 ? std::vector<std::int64_t>{2, frames * 4} : std::vector<std::int64_t>{2};
  const at::Tensor timestep = torch::randint(0, 1000, timesteps, gen, torch::kLong).to(torch::kFloat);
  return {latents, timestep, torch::randn({2, 5, 16}, gen), torch::randn({2, 4, frames, 4, 4}, gen)};
}

// A job stepped beside the others whose distance from the unsplit one bounds the split one's: the
// same plan in fp32, for a plan in bf16.
struct no_reference {};

// Every gradient of `job`'s trainable parameters (this rank's shards under fsdp), flat, in fp32.
template <class Job>
at::Tensor gradients(Job& job) {
  std::vector<at::Tensor> flat;
  for (const at::Tensor& p : job.trainable_parameters()) {
    if (p.grad().defined()) flat.push_back(p.grad().to(at::kFloat).flatten());
  }
  return at::cat(flat);
}

template <class Job>
at::Tensor parameters(Job& job) {
  std::vector<at::Tensor> flat;
  for (const at::Tensor& p : job.trainable_parameters()) flat.push_back(p.detach().to(at::kFloat).flatten());
  return at::cat(flat);
}

// `steps` SGD steps of both jobs on the same batches (chosen by each job's data_rank). Without a
// reference: every loss and every gradient of this rank's trainable parameters (its shards under
// fsdp) within `tolerance` of the unsplit job's, and the parameters at the end. With one (bf16,
// whose rounding differs with the order of each sum): the split job's gradients and final
// parameters no further from the fp32 reference's than 4 times the unsplit job's distance from them
// (two bf16 runs' distances from fp32 differ by up to about 2.5 times, measured over these steps
// and ranks; a split that lost or doubled a part misses by tens of times), and its loss within one
// bf16 rounding of the unsplit job's.
template <class Split, class Whole, class Reference, class Loss>
void check_same_training(Split& split, Whole& whole, Reference& reference, const Loss& loss_of, double tolerance,
                         int steps = 10) {
  constexpr bool has_reference = !std::is_same_v<Reference, no_reference>;
  REQUIRE(split.data_rank() == world().rank() / group_size());
  REQUIRE(split.data_world_size() == world().world_size() / group_size());
  const auto sgd = [](auto& job) {
    return torch::optim::SGD(job.trainable_parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  };
  torch::optim::SGD split_optimizer = sgd(split), whole_optimizer = sgd(whole);
  std::optional<torch::optim::SGD> reference_optimizer;
  if constexpr (has_reference) reference_optimizer.emplace(sgd(reference));
  for (int step = 0; step < steps; ++step) {
    CAPTURE(step);
    const int data_rank = world().rank() / group_size();
    const at::Tensor split_loss = loss_of(split, step, data_rank, true);
    split.backward(split_loss);
    const at::Tensor whole_loss = loss_of(whole, step, data_rank, false);
    whole.backward(whole_loss);
    if constexpr (has_reference) {
      const at::Tensor reference_loss = loss_of(reference, step, data_rank, false);
      reference.backward(reference_loss);
      // One scalar: within one bf16 rounding (2^-8) of the unsplit run's.
      CHECK(difference(split_loss.detach(), whole_loss.detach()) <= 1.0 / 256);
      const at::Tensor fp32 = gradients(reference);
      CHECK(difference(gradients(split), fp32) <= 4 * difference(gradients(whole), fp32) + tolerance);
    } else {
      CHECK(difference(split_loss.detach(), whole_loss.detach()) <= tolerance);
      const std::vector<at::Tensor> a = split.trainable_parameters();
      const std::vector<at::Tensor> b = whole.trainable_parameters();
      REQUIRE(a.size() == b.size());
      for (std::size_t i = 0; i < a.size(); ++i) {
        CAPTURE(i);
        REQUIRE(a[i].grad().defined() == b[i].grad().defined());
        if (a[i].grad().defined()) CHECK(difference(a[i].grad(), b[i].grad()) <= tolerance);
      }
    }
    split_optimizer.step();
    whole_optimizer.step();
    split.zero_grad();
    whole.zero_grad();
    if constexpr (has_reference) {
      reference_optimizer->step();
      reference.zero_grad();
    }
  }
  if constexpr (has_reference) {
    const at::Tensor fp32 = parameters(reference);
    CHECK(difference(parameters(split), fp32) <= 4 * difference(parameters(whole), fp32) + tolerance);
  } else {
    CHECK(difference(parameters(split), parameters(whole)) <= 10 * tolerance);
  }
}

// The loss of a Llama job on the batch of `data_rank` at `step`; under the split, over the group.
template <class Job>
at::Tensor llama_loss(Job& job, int step, int data_rank, bool split) {
  const at::Tensor ids = token_batch(step, data_rank);
  const at::Tensor logits = job.forward(ids);
  if (split) return loom::models::causal_lm_loss(logits, labels_of(ids, step), job.module()->model->sequence);
  return loom::models::causal_lm_loss(logits, labels_of(ids, step));
}

template <class Job>
at::Tensor wan_loss(Job& job, int step, int data_rank, bool /*split*/) {
  const video_batch batch = wan_batch(step, data_rank);
  const at::Tensor predicted = job.forward(batch.latents, batch.timestep, batch.text);
  return torch::mse_loss(predicted.to(at::kFloat), batch.target);
}

enum class variant { plain, lora, recompute, bf16 };

std::string name_of(variant v) {
  switch (v) {
    case variant::plain: return "plain";
    case variant::lora: return "lora";
    case variant::recompute: return "recompute";
    case variant::bf16: return "bf16";
  }
  return "?";
}

// Both jobs of `model_stage` for `v` and `strategy`, checked as above.
template <class ModelStage, class Strategy, class Loss>
void check_variant(const ModelStage& model_stage, variant v, const Strategy& strategy, const Loss& loss_of,
                   const std::vector<std::string>& targets, int steps = 10) {
  const auto sp = loom::sequence_parallel_stage::checked({.size = static_cast<std::size_t>(group_size())});
  const auto run = [&](const auto& plan, double tolerance, const auto&... reference_plan) {
    auto split = loom::build(plan | sp | strategy, world());
    auto whole = loom::build(plan | strategy, world());
    const std::string schedule = split.schedule().to_string();
    CHECK_THAT(schedule, ContainsSubstring(fmt::format("all_to_all forward sequence[{}]", group_size())));
    CHECK_THAT(schedule, ContainsSubstring(fmt::format("all_to_all backward sequence[{}]", group_size())));
    if (v == variant::recompute) CHECK_THAT(schedule, ContainsSubstring("all_to_all recompute"));
    CHECK_THAT(split.describe(), ContainsSubstring("sequence parallel"));
    if constexpr (sizeof...(reference_plan) == 0) {
      no_reference none;
      check_same_training(split, whole, none, loss_of, tolerance, steps);
    } else {
      auto reference = loom::build((reference_plan | ... | strategy), world());
      check_same_training(split, whole, reference, loss_of, tolerance, steps);
    }
  };
  const auto seeded = model_stage | loom::seeded(7);
  const loom::lora_stage adapters = loom::lora_stage::checked(4, [&] {
    loom::target_list list;
    for (const std::string& t : targets) list.push_back(loom::target(t));
    return list;
  }());
  switch (v) {
    case variant::plain: run(seeded, 1e-5); break;
    case variant::lora: run(seeded | adapters, 1e-5); break;
    case variant::recompute: run(seeded | loom::recompute() | adapters, 1e-5); break;
    // bf16 rounds each product, and the split runs' sums go in another order: each result is within
    // bf16's own distance from the fp32 run's.
    case variant::bf16: run(seeded | loom::mixed_precision({.param = loom::bf16}), 1e-5, seeded); break;
  }
}

}  // namespace

TEST_CASE("Llama with sequence_parallel: the unsplit run's losses, gradients and state", "[sequence_parallel]") {
  REQUIRE(world().world_size() >= 2);
  const variant v = GENERATE(variant::plain, variant::lora, variant::recompute, variant::bf16);
  const int strategy = GENERATE(0, 1, 2);
  CAPTURE(name_of(v), strategy);
  if (strategy == 2 && !hybrid_world()) return;
  const std::vector<std::string> targets{"q_proj", "v_proj"};
  if (strategy == 2) {
    check_variant(
        loom::model<loom::models::CausalLM>(small_llama()), v, hybrid(),
        [](auto& job, int step, int data_rank, bool split) { return llama_loss(job, step, data_rank, split); },
        targets);
  } else if (strategy == 0) {
    check_variant(
        loom::model<loom::models::CausalLM>(small_llama()), v, loom::ddp(),
        [](auto& job, int step, int data_rank, bool split) { return llama_loss(job, step, data_rank, split); },
        targets);
  } else {
    check_variant(
        loom::model<SubclassLlama>(small_llama()), v, loom::fsdp(),
        [](auto& job, int step, int data_rank, bool split) {
          const at::Tensor ids = token_batch(step, data_rank);
          const at::Tensor logits = job.forward(ids);
          if (split) return loom::models::causal_lm_loss(logits, labels_of(ids, step), job.module().model->sequence);
          return loom::models::causal_lm_loss(logits, labels_of(ids, step));
        },
        targets);
  }
}

TEST_CASE("Gemma 3's sliding-window layers with sequence_parallel: the unsplit run's losses, gradients and state",
          "[sequence_parallel]") {
  const variant v = GENERATE(variant::plain, variant::recompute);
  CAPTURE(name_of(v));
  // Six steps: with the scaled embeddings and the soft-capped logits, the two runs' rounding, which
  // momentum carries from step to step, grows past 1e-5 of the largest gradient by the eighth step
  // (1.5e-5 on one rank of four).
  check_variant(
      loom::model<loom::models::CausalLM>(small_gemma()), v, loom::fsdp(),
      [](auto& job, int step, int data_rank, bool split) { return llama_loss(job, step, data_rank, split); },
      {"q_proj", "v_proj"}, /*steps=*/6);
}

TEST_CASE("Wan with sequence_parallel: the unsplit run's losses, gradients and state", "[sequence_parallel]") {
  const variant v = GENERATE(variant::plain, variant::lora, variant::recompute, variant::bf16);
  const int strategy = GENERATE(0, 1, 2);
  CAPTURE(name_of(v), strategy);
  if (strategy == 2 && !hybrid_world()) return;
  const std::vector<std::string> targets{"to_q", "to_k", "to_v", "to_out.0"};
  const auto loss = [](auto& job, int step, int data_rank, bool split) {
    return wan_loss(job, step, data_rank, split);
  };
  if (strategy == 2) {
    check_variant(loom::model<loom::models::Wan>(small_wan()), v, hybrid(), loss, targets);
  } else if (strategy == 0) {
    check_variant(loom::model<loom::models::Wan>(small_wan()), v, loom::ddp(), loss, targets);
  } else {
    check_variant(loom::model<loom::models::Wan>(small_wan()), v, loom::fsdp(), loss, targets);
  }
}

namespace {

// A model with no loom::nn::Attention: nothing to split its sequence around.
struct Plain : torch::nn::Module {
  Plain() : fc(register_module("fc", torch::nn::Linear(4, 4))) {}
  at::Tensor forward(const at::Tensor& x) { return fc(x); }
  torch::nn::Linear fc;
};

}  // namespace

TEST_CASE("sequence_parallel's errors name the fix", "[sequence_parallel]") {
  const int ranks = world().world_size();
  SECTION("a size that does not divide the world") {
    const auto stage = loom::sequence_parallel_stage::checked({.size = static_cast<std::size_t>(ranks + 1)});
    CHECK_THROWS_WITH(
        loom::build(loom::model<loom::models::CausalLM>(small_llama()) | loom::seeded(1) | stage | loom::ddp(),
                    world()),
        ContainsSubstring(
            fmt::format("sequence_parallel({}) does not divide the world of {} ranks", ranks + 1, ranks)));
  }
  SECTION("a size that does not divide the heads") {
    loom::models::causal_lm_config config = small_llama();
    config.num_attention_heads = 5;
    config.num_key_value_heads = 5;
    config.head_dim = 8;
    config.hidden_size = 40;
    const auto stage = loom::sequence_parallel_stage::checked({.size = static_cast<std::size_t>(group_size())});
    CHECK_THROWS_WITH(
        loom::build(loom::model<loom::models::CausalLM>(config) | loom::seeded(1) | stage | loom::fsdp(), world()),
        ContainsSubstring("model.layers.0.self_attn.attention has 5 attention heads, which") &&
            ContainsSubstring("give a size that divides its heads"));
  }
  SECTION("a model with no loom::nn::Attention") {
    const auto stage = loom::sequence_parallel_stage::checked({.size = static_cast<std::size_t>(group_size())});
    CHECK_THROWS_WITH(loom::build(loom::model<Plain>() | loom::seeded(1) | stage | loom::ddp(), world()),
                      ContainsSubstring("has no loom::nn::Attention"));
  }
}

namespace {

// A model with an Attention but no Sequence: nothing splits its input.
struct AttentionOnly : torch::nn::Module {
  AttentionOnly()
      : attention(register_module("attention", loom::nn::Attention(loom::nn::attention_options{
                                                   .heads = 6, .head_dim = 4, .scale = std::nullopt}))) {}
  at::Tensor forward(const at::Tensor& q) { return attention(q, q, q); }
  loom::nn::Attention attention;
};

}  // namespace

TEST_CASE("sequence_parallel refuses a model with nowhere to split its input", "[sequence_parallel]") {
  const auto stage = loom::sequence_parallel_stage::checked({.size = static_cast<std::size_t>(group_size())});
  CHECK_THROWS_WITH(loom::build(loom::model<AttentionOnly>() | loom::seeded(1) | stage | loom::ddp(), world()),
                    ContainsSubstring("has no loom::nn::Sequence, which splits its input: register one"));
}

// The split's own checks, before any all-to-all goes out: each rank throws at the same call, so the
// group never waits on an exchange another rank skipped.
TEST_CASE("an attention out of its declared order, or in another dtype, is a sentence naming the entry",
          "[sequence_parallel]") {
  using loom::nn::sequence_split;
  const int k = group_size();
  const loom::nn::attention_options options{.heads = 12, .head_dim = 2, .scale = std::nullopt};
  sequence_split split(std::make_shared<loom::sequence_group>(world(), k),
                       {{.name = "blocks.0.attention", .options = options, .unit = "", .recomputed = false},
                        {.name = "blocks.1.attention", .options = options, .unit = "", .recomputed = false}},
                       at::kFloat);
  REQUIRE(split.schedule_entries().size() == 8);
  const auto exchanged = [&](at::ScalarType dtype) {
    // [k, batch, tokens / k, 3 × heads / k, head_dim]: q, k and v for one all-to-all.
    return torch::ones({k, 1, 2, 3 * options.heads / k, options.head_dim}, at::TensorOptions(dtype));
  };
  at::Tensor output = exchanged(at::kFloat);

  split.begin_forward();
  CHECK_THROWS_WITH(split.all_to_all(1, sequence_split::exchange::to_heads, false, exchanged(at::kFloat), output),
                    ContainsSubstring("the model issued blocks.1.attention's q,k,v forward all-to-all where the "
                                      "schedule has entry 0, all_to_all forward") &&
                        ContainsSubstring("in the order it was registered"));
  split.begin_forward();
  CHECK_THROWS_WITH(
      split.all_to_all(0, sequence_split::exchange::to_heads, false, exchanged(at::kBFloat16), output),
      ContainsSubstring("blocks.0.attention's q,k,v forward all-to-all exchanges BFloat16 where the schedule "
                        "declares Float"));
  // In order it goes out, and its result is every rank's part; a backward after half a forward is refused.
  split.begin_forward();
  split.all_to_all(0, sequence_split::exchange::to_heads, false, exchanged(at::kFloat), output);
  CHECK(output.sum().item<double>() == static_cast<double>(exchanged(at::kFloat).numel()));
  CHECK_THROWS_WITH(split.begin_backward(),
                    ContainsSubstring("the forward issued 1 of the 4 all-to-alls its attentions declare (the next "
                                      "was blocks.0.attention's attended forward all-to-all)"));
  // The same all-to-all twice in one forward.
  split.begin_forward();
  split.all_to_all(0, sequence_split::exchange::to_heads, false, exchanged(at::kFloat), output);
  CHECK_THROWS_WITH(split.all_to_all(0, sequence_split::exchange::to_heads, false, exchanged(at::kFloat), output),
                    ContainsSubstring("the model issued blocks.0.attention's q,k,v forward all-to-all where the "
                                      "schedule has entry 1, all_to_all forward"));
}

// Last: a failed forward ends the job on every rank.
TEST_CASE("a sequence the group cannot split evenly is refused on every rank, naming the fix", "[sequence_parallel]") {
  const auto stage = loom::sequence_parallel_stage::checked({.size = static_cast<std::size_t>(group_size())});
  auto job =
      loom::build(loom::model<loom::models::CausalLM>(small_llama()) | loom::seeded(1) | stage | loom::fsdp(), world());
  const at::Tensor ids = torch::zeros({2, 12 * group_size() + 1}, torch::kLong);
  CHECK_THROWS_WITH(job.forward(ids),
                    ContainsSubstring(fmt::format("the sequence has {} tokens, which {} ranks cannot split evenly: "
                                                  "give sequences whose length is a multiple of {}",
                                                  12 * group_size() + 1, group_size(), group_size())));
}

// The loop every LibTorch user writes, with torch::optim's optimizers and their own zero_grad:
//
//   opt.zero_grad();  // detaches every gradient in place, then drops or zeroes it
//   for each micro-batch: job.backward(loss_of(job.forward(x)) / 2);  // the first under job.no_sync()
//   job.clip_grad_norm(1.0);
//   opt.step();
//
// under every strategy (local() at 1 rank; ddp(), with and without gradient_as_bucket_view; fsdp();
// hybrid sharding), alone and with lora, mixed_precision, recompute and sequence_parallel, for SGD,
// Adam, AdamW and loom::optim::AdamW, zero_grad(true) and zero_grad(false), for both model forms: 3
// steps of 2 micro-batches, different on every rank and at every step, end bit for bit where
// loom::train's 3 steps end.
#include "small_models.hpp"
#include "world.hpp"

#include <loom/loom.hpp>
#include <loom/models/causal_lm.hpp>
#include <loom/optim/adamw.hpp>
#include <loom/train/loop.hpp>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/torch.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

using loom::testing::causal_lm;
using loom::testing::small_llama;
using loom::testing::world;

namespace {

constexpr int steps = 3;
constexpr int micro_batches = 2;
constexpr double max_norm = 1.0;

struct SubclassLlama : loom::models::CausalLMImpl {  // the subclass form
  using CausalLMImpl::CausalLMImpl;
};

enum class strategy_kind { local, ddp, ddp_bucket_view, fsdp, hybrid };
enum class stage_kind { none, lora, mixed_precision, recompute, sequence_parallel };
enum class optimizer_kind { sgd, adam, adamw, loom_adamw };

std::string_view name_of(strategy_kind s) {
  switch (s) {
    case strategy_kind::local: return "local";
    case strategy_kind::ddp: return "ddp";
    case strategy_kind::ddp_bucket_view: return "ddp-bucket-view";
    case strategy_kind::fsdp: return "fsdp";
    case strategy_kind::hybrid: return "hybrid";
  }
  return "?";
}

std::string_view name_of(stage_kind s) {
  switch (s) {
    case stage_kind::none: return "alone";
    case stage_kind::lora: return "lora";
    case stage_kind::mixed_precision: return "mixed-precision";
    case stage_kind::recompute: return "recompute";
    case stage_kind::sequence_parallel: return "sequence-parallel";
  }
  return "?";
}

std::string_view name_of(optimizer_kind o) {
  switch (o) {
    case optimizer_kind::sgd: return "sgd";
    case optimizer_kind::adam: return "adam";
    case optimizer_kind::adamw: return "adamw";
    case optimizer_kind::loom_adamw: return "loom-adamw";
  }
  return "?";
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(optimizer_kind kind, std::vector<at::Tensor> parameters) {
  switch (kind) {
    case optimizer_kind::sgd:
      return std::make_unique<torch::optim::SGD>(std::move(parameters), torch::optim::SGDOptions(0.05).momentum(0.9));
    case optimizer_kind::adam:
      return std::make_unique<torch::optim::Adam>(std::move(parameters), torch::optim::AdamOptions(1e-2));
    case optimizer_kind::adamw:
      return std::make_unique<torch::optim::AdamW>(std::move(parameters), torch::optim::AdamWOptions(1e-2));
    case optimizer_kind::loom_adamw:
      return std::make_unique<loom::optim::AdamW>(std::move(parameters), torch::optim::AdamWOptions(1e-2));
  }
  return nullptr;
}

// The micro-batch of `data_rank` at (`step`, `micro`): 12 or 24 tokens (which 1, 2 and 3 ranks
// divide), their values by step, micro-batch and rank, some labels left out.
std::pair<at::Tensor, at::Tensor> batch(std::int64_t step, int micro, int data_rank) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + 97 * static_cast<std::uint64_t>(step) +
                                                      13 * static_cast<std::uint64_t>(micro) +
                                                      static_cast<std::uint64_t>(data_rank));
  const std::int64_t length = (step + micro) % 2 == 0 ? 12 : 24;
  const at::Tensor ids = torch::randint(64, {2, length}, gen, torch::kLong);
  at::Tensor labels = ids.clone();
  labels.index_put_({static_cast<std::int64_t>(micro), (step * 5) % length}, -100);
  return {ids, labels};
}

template <class Job>
at::Tensor loss_of(Job& job, std::int64_t step, int micro, bool split) {
  const auto [ids, labels] = batch(step, micro, job.data_rank());
  const at::Tensor logits = job.forward(ids);
  if (split) return loom::models::causal_lm_loss(logits, labels, causal_lm(job).model->sequence);
  return loom::models::causal_lm_loss(logits, labels);
}

struct loop_case {
  optimizer_kind optimizer;
  bool set_to_none;
  bool split;
};

// The user's loop, as loom::train runs its steps: the same micro-batches, the loss of each divided
// by their number, every one but the last under no_sync, the norm clipped, then the step.
template <class Job>
void user_loop(Job& job, const loop_case& c) {
  const std::unique_ptr<torch::optim::Optimizer> opt = make_optimizer(c.optimizer, job.trainable_parameters());
  for (std::int64_t step = 1; step <= steps; ++step) {
    opt->zero_grad(c.set_to_none);
    for (int micro = 0; micro < micro_batches; ++micro) {
      if (micro + 1 < micro_batches) {
        auto accumulate = job.no_sync();
        job.backward(loss_of(job, step, micro, c.split) / micro_batches);
      } else {
        job.backward(loss_of(job, step, micro, c.split) / micro_batches);
      }
    }
    (void)job.clip_grad_norm(max_norm);
    opt->step();
  }
}

template <class Job>
void train_loop(Job& job, const loop_case& c) {
  const std::unique_ptr<torch::optim::Optimizer> opt = make_optimizer(c.optimizer, job.trainable_parameters());
  loom::train(job, *opt, {.loss = [&](std::int64_t step, int micro) { return loss_of(job, step, micro, c.split); }},
              {.steps = steps, .accumulate = micro_batches, .clip_norm = max_norm, .set_to_none = c.set_to_none});
}

template <class Plan>
void check_same_as_train(const Plan& plan, const loop_case& c) {
  auto users = loom::build(plan, world());
  auto trained = loom::build(plan, world());
  loom::tensor_state before = users.state_dict();
  for (loom::named_tensor& t : before) t.tensor = t.tensor.clone();  // a job's state may be its parameters
  user_loop(users, c);
  train_loop(trained, c);
  const loom::tensor_state a = users.state_dict(), b = trained.state_dict();
  REQUIRE(a.size() == b.size());
  bool moved = false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    CAPTURE(a[i].name);
    REQUIRE(a[i].name == b[i].name);
    CHECK(torch::equal(a[i].tensor, b[i].tensor));
    moved = moved || !torch::equal(a[i].tensor, before[i].tensor);
  }
  CHECK(moved);  // both trained: what they agree on is not where they started
}

// The plan of `stage` over model M, under `strategy`.
template <class M, class Strategy>
void check_stage(stage_kind stage, const Strategy& strategy, const loop_case& c) {
  const auto base = loom::model<M>(small_llama()) | loom::seeded(11);
  switch (stage) {
    case stage_kind::none: check_same_as_train(base | strategy, c); break;
    case stage_kind::lora: check_same_as_train(base | loom::lora(4, {"q_proj", "v_proj"}) | strategy, c); break;
    case stage_kind::mixed_precision:
      check_same_as_train(base | loom::mixed_precision({.param = loom::bf16}) | strategy, c);
      break;
    case stage_kind::recompute: check_same_as_train(base | loom::recompute() | strategy, c); break;
    case stage_kind::sequence_parallel: {
      const auto sp = loom::sequence_parallel_stage::checked({.size = static_cast<std::size_t>(world().world_size())});
      check_same_as_train(base | sp | strategy, c);
      break;
    }
  }
}

template <class M>
void check_strategy(strategy_kind strategy, stage_kind stage, const loop_case& c) {
  switch (strategy) {
    case strategy_kind::local: check_stage<M>(stage, loom::local(), c); break;
    case strategy_kind::ddp: check_stage<M>(stage, loom::ddp(), c); break;
    case strategy_kind::ddp_bucket_view: check_stage<M>(stage, loom::ddp({.gradient_as_bucket_view = true}), c); break;
    case strategy_kind::fsdp: check_stage<M>(stage, loom::fsdp(), c); break;
    // One rank a shard group, the world a replicate group: hybrid sharding's paths at 2 and 3 ranks.
    case strategy_kind::hybrid: check_stage<M>(stage, loom::fsdp({.shard_group_size = 1}), c); break;
  }
}

}  // namespace

TEST_CASE("the plain LibTorch loop equals loom::train bit for bit", "[plain-loop]") {
  const bool distributed = world().world_size() > 1;
  const strategy_kind strategy = GENERATE(strategy_kind::local, strategy_kind::ddp, strategy_kind::ddp_bucket_view,
                                          strategy_kind::fsdp, strategy_kind::hybrid);
  const stage_kind stage = GENERATE(stage_kind::none, stage_kind::lora, stage_kind::mixed_precision,
                                    stage_kind::recompute, stage_kind::sequence_parallel);
  if (distributed == (strategy == strategy_kind::local)) return;  // local() alone, at 1 rank alone
  if (stage == stage_kind::sequence_parallel && !distributed) return;
  // A full rank of the matrix: every optimizer with both zero_grads, the forms taking turns.
  const optimizer_kind optimizer =
      GENERATE(optimizer_kind::sgd, optimizer_kind::adam, optimizer_kind::adamw, optimizer_kind::loom_adamw);
  const bool set_to_none = GENERATE(true, false);
  const bool holder = (static_cast<int>(optimizer) + static_cast<int>(set_to_none) + static_cast<int>(stage)) % 2 == 0;
  CAPTURE(name_of(strategy), name_of(stage), name_of(optimizer), set_to_none, holder);
  const loop_case c{optimizer, set_to_none, stage == stage_kind::sequence_parallel};
  if (holder) {
    check_strategy<loom::models::CausalLM>(strategy, stage, c);
  } else {
    check_strategy<SubclassLlama>(strategy, stage, c);
  }
}

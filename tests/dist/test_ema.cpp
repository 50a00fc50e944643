// loom::ema under every strategy, at 1, 2 and 3 ranks, in the user's own loop (torch::optim::AdamW,
// opt.zero_grad()) and in loom::train: each rank's averages are the whole weights' average, bit for
// bit, computed from the gathered weights after every step (before start_step a copy, then the
// blend); under fsdp() no rank holds a whole copy; the averages are the weights while swapped in and
// the weights come back bit for bit; loom::train evaluates with them, and a run stopped at a
// checkpoint and resumed ends with the averages of a run never stopped.
#include "small_models.hpp"
#include "world.hpp"

#include <loom/loom.hpp>
#include <loom/models/causal_lm.hpp>
#include <loom/runtime/host_reads.hpp>
#include <loom/train/ema.hpp>
#include <loom/train/loop.hpp>

#include <torch/optim/adamw.h>
#include <torch/torch.h>

#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <type_traits>

using loom::testing::causal_lm;
using loom::testing::shared_scratch;
using loom::testing::small_llama;
using loom::testing::world;

namespace {

constexpr std::int64_t steps = 5;
constexpr loom::ema_options averaging{.decay = 0.75, .start_step = 3};

struct SubclassLlama : loom::models::CausalLMImpl {  // the Module subclass form
  using CausalLMImpl::CausalLMImpl;
};

// Tokens by step and rank: every rank's gradients differ, and every step's.
at::Tensor tokens(std::int64_t step, int data_rank) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(500 + 31 * static_cast<std::uint64_t>(step) +
                                                      static_cast<std::uint64_t>(data_rank));
  return torch::randint(64, {2, step % 2 == 0 ? 12 : 6}, gen, torch::kLong);
}

template <class Job>
at::Tensor loss_of(Job& job, std::int64_t step) {
  const at::Tensor ids = tokens(step, job.data_rank());
  return loom::models::causal_lm_loss(job.forward(ids), ids);
}

std::map<std::string, at::Tensor> by_name(const loom::tensor_state& state) {
  std::map<std::string, at::Tensor> named;
  for (const loom::named_tensor& t : state) named.emplace(t.name, t.tensor.clone());
  return named;
}

// The averages, as FastVideo computes them, of the whole weights gathered after each step.
struct whole_average {
  std::map<std::string, at::Tensor> values;

  template <class Job>
  void update(Job& job, std::int64_t step) {
    const auto weights = by_name(job.state_dict());
    for (const std::string& name : job.trainable_names()) {
      const at::Tensor weight = weights.at(name).to(at::kFloat);
      // FastVideo's EMACallback: nothing before start_iter; at the first step from it, the shadow
      // made from the weights; then shadow.mul_(d).add_(w, alpha=1 - d) at every step from it.
      if (step < averaging.start_step) continue;
      auto [it, fresh] = values.try_emplace(name, weight.clone());
      it->second.mul_(averaging.decay).add_(weight, 1 - averaging.decay);
    }
  }
};

// `sharded`: the plan shards the trainable parameters (fsdp() over several ranks, no LoRA, whose
// adapters it replicates): the averages are then this rank's part alone.
template <class Plan>
void check_user_loop(const Plan& plan, bool sharded) {
  auto job = loom::build(plan, world());
  torch::optim::AdamW opt(job.trainable_parameters(), torch::optim::AdamWOptions(1e-2));
  loom::ema averages(job, averaging);
  whole_average expected;
  for (std::int64_t step = 1; step <= steps; ++step) {
    opt.zero_grad();
    job.backward(loss_of(job, step));
    opt.step();
    averages.update(step);
    expected.update(job, step);
  }
  // Sharded as the weights are: this rank's part of each, fp32.
  const auto mine = averages.state();
  const auto parameters = job.trainable_parameters();
  REQUIRE(mine.size() == parameters.size());
  std::int64_t held = 0, whole = 0;
  for (std::size_t i = 0; i < mine.size(); ++i) {
    CHECK(mine[i].tensor.sizes() == parameters[i].sizes());
    CHECK(mine[i].tensor.scalar_type() == at::kFloat);
    held += mine[i].tensor.numel();
    whole += expected.values.at(mine[i].name).numel();
  }
  // No rank holds a whole copy: about 1/N of it each.
  if (sharded) {
    CHECK(held * world().world_size() <= whole + 64 * static_cast<std::int64_t>(mine.size()));
  } else {
    CHECK(held == whole);
  }
  const auto weights = by_name(job.state_dict());
  {
    const auto in_place = averages.swapped_in();
    const auto swapped = by_name(job.state_dict());
    bool differs = false;
    for (const auto& [name, value] : expected.values) {
      CAPTURE(name);
      CHECK(torch::equal(swapped.at(name), value));
      differs = differs || !torch::equal(value, weights.at(name));
    }
    CHECK(differs);  // the averages lag the weights: the check above is not of the weights
  }
  for (const auto& [name, value] : by_name(job.state_dict())) {
    CAPTURE(name);
    CHECK(torch::equal(value, weights.at(name)));
  }
}

// loom::train with averages for `until` of `steps` steps in `folder` (resuming what is there),
// checkpointing every 2; its averages, whole, and its last evaluation's loss.
template <class Plan>
std::pair<std::map<std::string, at::Tensor>, double> train_run(const Plan& plan, const std::filesystem::path& folder,
                                                               std::int64_t until) {
  auto job = loom::build(plan, world());
  torch::optim::AdamW opt(job.trainable_parameters(), torch::optim::AdamWOptions(1e-2));
  loom::ema averages(job, averaging);
  const at::Tensor held_out = tokens(99, 0);
  const loom::train_result result =
      loom::train(job, opt, averages,
                  {.loss = [&](std::int64_t step, int) { return loss_of(job, step); },
                   .eval_loss = [&] { return loom::models::causal_lm_loss(job.forward(held_out), held_out); }},
                  {.steps = until, .out = folder, .checkpoint_every = 2, .eval_every = 1, .log_every = 100});
  REQUIRE(result.last_eval);
  const auto held_out_loss = [&] {
    const c10::NoGradGuard no_grad;
    return loom::host_value<double>(loom::models::causal_lm_loss(job.forward(held_out), held_out));
  };
  const double trained_loss = held_out_loss();
  const auto in_place = averages.swapped_in();
  // The evaluation ran on the averages: the loss of the averaged weights (averaged over the ranks,
  // which may round it), not of the weights.
  const double averaged_loss = held_out_loss();
  CHECK(result.last_eval->loss == Catch::Approx(averaged_loss).epsilon(1e-6));
  // Until start_step the average is a copy of the weights; from it on, it lags them, and the
  // evaluation is nearer the averaged weights' loss than the trained ones'.
  if (until > averaging.start_step) {
    CHECK(trained_loss != averaged_loss);
    CHECK(std::abs(result.last_eval->loss - averaged_loss) < std::abs(result.last_eval->loss - trained_loss));
  }
  if (until < averaging.start_step) CHECK(trained_loss == averaged_loss);
  return {by_name(job.state_dict()), result.last_eval->loss};
}

template <class Plan>
void check_resumed(const Plan& plan, const std::string& name) {
  const auto never_stopped = train_run(plan, shared_scratch("ema", name + "-whole"), steps);
  const auto folder = shared_scratch("ema", name + "-stopped");
  (void)train_run(plan, folder, 2);
  const auto resumed = train_run(plan, folder, steps);
  CHECK(resumed.second == never_stopped.second);
  for (const auto& [tensor_name, value] : never_stopped.first) {
    CAPTURE(tensor_name);
    CHECK(torch::equal(resumed.first.at(tensor_name), value));
  }
}

enum class strategy_kind { local, ddp, fsdp };

template <class M, class Strategy>
void check_plans(const Strategy& strategy, const std::string& name, bool resume) {
  const auto base = loom::model<M>(small_llama()) | loom::seeded(5);
  const bool shards = std::is_same_v<Strategy, loom::fsdp_stage> && world().world_size() > 1;
  SECTION("whole model") {
    check_user_loop(base | strategy, shards);
    if (resume) check_resumed(base | strategy, name + "-whole");
  }
  SECTION("lora: the adapters alone") {
    const auto adapted = base | loom::lora(4, {"q_proj", "v_proj"}) | strategy;
    check_user_loop(adapted, false);
    if (resume) check_resumed(adapted, name + "-lora");
  }
}

template <class M>
void check_strategy(strategy_kind strategy, bool resume) {
  switch (strategy) {
    case strategy_kind::local: check_plans<M>(loom::local(), "local", resume); break;
    case strategy_kind::ddp: check_plans<M>(loom::ddp(), "ddp", resume); break;
    case strategy_kind::fsdp: check_plans<M>(loom::fsdp(), "fsdp", resume); break;
  }
}

}  // namespace

TEST_CASE("each rank's averages are the whole weights' average, and resume bit for bit", "[ema]") {
  const bool one_rank = world().world_size() == 1;
  const auto strategy = one_rank ? strategy_kind::local : GENERATE(strategy_kind::ddp, strategy_kind::fsdp);
  const bool holder = GENERATE(true, false);
  CAPTURE(static_cast<int>(strategy), holder);
  // Resumed under the sharding strategy, in the holder form: the checkpoint's paths are the same for both.
  const bool resume = strategy != strategy_kind::ddp && holder;
  if (holder) {
    check_strategy<loom::models::CausalLM>(strategy, resume);
  } else {
    check_strategy<SubclassLlama>(strategy, resume);
  }
}

TEST_CASE("ema options out of range are refused, named", "[ema]") {
  auto job = loom::build(loom::model<loom::models::CausalLM>(small_llama()) | loom::seeded(5), world());
  CHECK_THROWS_WITH(loom::ema(job, {.decay = 1.0}), "loom: ema: decay is 1; give a decay in [0, 1), e.g. 0.999");
  CHECK_THROWS_WITH(loom::ema(job, {.start_step = -1}),
                    "loom: ema: start_step is -1; give the step the averaging starts at (0: the first)");
}

TEST_CASE("a checkpoint saved without averages is refused by a run that keeps them", "[ema]") {
  const auto plan = loom::model<loom::models::CausalLM>(small_llama()) | loom::seeded(5) | loom::fsdp();
  const auto folder = shared_scratch("ema", "without");
  {
    auto job = loom::build(plan, world());
    torch::optim::AdamW opt(job.trainable_parameters(), torch::optim::AdamWOptions(1e-2));
    loom::train(job, opt, {.loss = [&](std::int64_t step, int) { return loss_of(job, step); }},
                {.steps = 2, .out = folder, .log_every = 100});
  }
  auto job = loom::build(plan, world());
  torch::optim::AdamW opt(job.trainable_parameters(), torch::optim::AdamWOptions(1e-2));
  loom::ema averages(job, averaging);
  CHECK_THROWS_WITH(
      loom::train(job, opt, averages, {.loss = [&](std::int64_t step, int) { return loss_of(job, step); }},
                  {.steps = 3, .out = folder, .log_every = 100}),
      Catch::Matchers::ContainsSubstring("it holds no moving average of the weights"));
}

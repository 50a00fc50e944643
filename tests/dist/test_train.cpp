// loom::train across processes: a signal that reaches one rank stops every rank after the same
// step, a loss that is not finite on one rank stops them all (or, under a failpoint, is skipped by
// them all), accumulation under ddp() and fsdp() equals one batch, and the device is read on the
// host only for a logged step.
#include "small_models.hpp"
#include "world.hpp"

#include <loom/loom.hpp>
#include <loom/models/causal_lm.hpp>
#include <loom/models/wan.hpp>
#include <loom/runtime/host_reads.hpp>
#include <loom/runtime/peak_memory.hpp>
#include <loom/train/flow_matching.hpp>
#include <loom/train/loop.hpp>
#include <models/tiny_gpt.hpp>

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <nlohmann/json.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

using Catch::Matchers::ContainsSubstring;
using loom::testing::shared_scratch;
using loom::testing::small_llama;
using loom::testing::small_wan;
using loom::testing::world;

namespace {

namespace fs = std::filesystem;

constexpr models::tiny_gpt_config small{.vocab = 32, .d = 16, .layers = 2, .heads = 2, .ctx = 8};
constexpr auto model = loom::model<models::TinyGpt>(small) | loom::seeded(1);

bool last_rank() { return world().rank() == world().world_size() - 1; }

// Rows [first, first + count) of this rank's 4 rows of step `step`, drawn on the CPU, on the rank's device.
std::pair<at::Tensor, at::Tensor> rows(std::int64_t step, std::int64_t first, std::int64_t count) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100 * static_cast<std::uint64_t>(step) +
                                                      static_cast<std::uint64_t>(world().rank()));
  const at::Tensor x = torch::randint(0, small.vocab, {4, small.ctx}, gen);
  return {x.narrow(0, first, count).to(world().device()), x.roll(-1, 1).narrow(0, first, count).to(world().device())};
}

template <class Plan>
void check_accumulation(const Plan& plan, const std::string& name) {
  auto whole = loom::build(plan, world());
  auto halves = loom::build(plan, world());
  torch::optim::SGD whole_optimizer(whole.trainable_parameters(), 0.1);
  torch::optim::SGD halves_optimizer(halves.trainable_parameters(), 0.1);
  loom::train(whole, whole_optimizer,
              {.loss =
                   [&](std::int64_t step, int) {
                     auto [x, y] = rows(step, 0, 4);
                     return whole.forward(x, y);
                   }},
              {.steps = 3, .clip_norm = 0.5, .out = shared_scratch("train", name + "-whole")});
  loom::train(halves, halves_optimizer,
              {.loss =
                   [&](std::int64_t step, int micro) {
                     auto [x, y] = rows(step, 2 * micro, 2);
                     return halves.forward(x, y);
                   }},
              {.steps = 3, .accumulate = 2, .clip_norm = 0.5, .out = shared_scratch("train", name + "-halves")});
  const auto a = whole.state_dict(), b = halves.state_dict();
  for (std::size_t i = 0; i < a.size(); ++i) {
    CAPTURE(a[i].name);
    CHECK(torch::allclose(a[i].tensor, b[i].tensor, 1e-5, 1e-6));
  }
}

// Under a failpoint that multiplies rank 1's loss by NaN at the 3rd micro-batch (step 3), set by
// meson (tests/dist/meson.build: nonfinite-*): the run stops at the next read (step 4's checkpoint),
// naming the step and the rank, and the checkpoint of step 2 stays the newest.
template <class Plan>
void check_nonfinite_stop(const Plan& plan, const std::string& name) {
  REQUIRE(std::getenv("LOOM_FAILPOINT_VALUE") != nullptr);
  auto job = loom::build(plan, world());
  torch::optim::AdamW optimizer(job.trainable_parameters(), torch::optim::AdamWOptions(1e-2));
  const fs::path out = shared_scratch("train", name);
  CHECK_THROWS_WITH(
      loom::train(
          job, optimizer,
          {.loss =
               [&](std::int64_t step, int) {
                 auto [x, y] = rows(step, 0, 4);
                 return job.forward(x, y);
               }},
          {.steps = 6, .clip_norm = 1.0, .out = out, .checkpoint_every = 2, .log_every = 100, .log_seconds = 1e9}),
      ContainsSubstring("the loss of step 3 is nan (averaged over the ranks), not finite on rank 1") &&
          ContainsSubstring("the run stops before the update of step 4"));
  CHECK(fs::exists(out / "checkpoints" / "step-00000002" / "manifest.json"));
  CHECK_FALSE(fs::exists(out / "checkpoints" / "step-00000004"));
}

// The same failpoint under nonfinite_policy::skip: step 3 is skipped on every rank (no optimizer
// step, no learning-rate step) and logged, and the run ends bit for bit where a run of the other
// steps' batches, at the schedule's rates 1 to 5, ends. A second non-finite step would be one more
// than max_skipped_steps allows.
template <class Plan>
void check_nonfinite_skip(const Plan& plan, const std::string& name) {
  REQUIRE(std::getenv("LOOM_FAILPOINT_VALUE") != nullptr);
  const auto trained = [&](std::int64_t steps, const fs::path& out, auto batch_of) {
    auto job = loom::build(plan, world());
    torch::optim::AdamW optimizer(job.trainable_parameters(), torch::optim::AdamWOptions(1e-2));
    const loom::train_result result =
        loom::train(job, optimizer,
                    {.loss =
                         [&](std::int64_t step, int) {
                           auto [x, y] = rows(batch_of(step), 0, 4);
                           return job.forward(x, y);
                         }},
                    {.steps = steps,
                     .clip_norm = 1.0,
                     .lr = loom::lr_schedule{.peak = 2e-2, .warmup_steps = 3, .total_steps = steps},
                     .out = out,
                     .checkpoint_every = 2,
                     .log_every = 100,
                     .log_seconds = 1e9,
                     .on_nonfinite = loom::nonfinite_policy::skip,
                     .max_skipped_steps = 1});
    CHECK(result.outcome == loom::train_outcome::finished);
    return job.state_dict();
  };
  // First: the failpoint's 3rd pass is in this run.
  const fs::path out = shared_scratch("train", name);
  const auto skipped = trained(6, out, [](std::int64_t step) { return step; });
  const auto straight = trained(5, shared_scratch("train", name + "-straight"),
                                [](std::int64_t step) { return step < 3 ? step : step + 1; });
  REQUIRE(skipped.size() == straight.size());
  for (std::size_t i = 0; i < skipped.size(); ++i) {
    CAPTURE(skipped[i].name);
    CHECK(torch::equal(skipped[i].tensor, straight[i].tensor));
  }
  if (world().rank() == 0) {
    std::ifstream metrics(out / "metrics.jsonl");
    std::vector<nlohmann::json> skips;
    for (std::string line; std::getline(metrics, line);) {
      const auto parsed = nlohmann::json::parse(line);
      if (parsed.contains("skipped")) skips.push_back(parsed);
    }
    REQUIRE(skips.size() == 1);
    CHECK(skips[0]["step"] == 3);
    CHECK(skips[0]["rank"] == 1);
    CHECK(skips[0]["skipped_steps"] == 1);
  }
}

}  // namespace

TEST_CASE("failpoint: a NaN loss on rank 1 at step 3 stops every rank under ddp()", "[.nonfinite-stop-ddp]") {
  check_nonfinite_stop(model | loom::ddp(), "nonfinite-stop-ddp");
}

TEST_CASE("failpoint: a NaN loss on rank 1 at step 3 stops every rank under fsdp()", "[.nonfinite-stop-fsdp]") {
  check_nonfinite_stop(model | loom::fsdp(), "nonfinite-stop-fsdp");
}

TEST_CASE("failpoint: a NaN loss on rank 1 at step 3 is skipped on every rank under ddp()", "[.nonfinite-skip-ddp]") {
  check_nonfinite_skip(model | loom::ddp(), "nonfinite-skip-ddp");
}

TEST_CASE("failpoint: a NaN loss on rank 1 at step 3 is skipped on every rank under fsdp()", "[.nonfinite-skip-fsdp]") {
  check_nonfinite_skip(model | loom::fsdp(), "nonfinite-skip-fsdp");
}

TEST_CASE("accumulated micro-batches equal one batch, under ddp() and fsdp()", "[train]") {
  check_accumulation(model | loom::ddp(), "ddp");
  check_accumulation(model | loom::fsdp(), "fsdp");
}

TEST_CASE(
    "SIGUSR1 on the last rank alone stops every rank after the same step, checkpointed; the run resumed "
    "ends where one never stopped ends",
    "[train]") {
  const bool async_checkpoints = GENERATE(false, true);
  CAPTURE(async_checkpoints);
  // Full training (no LoRA): every parameter and AdamW's moments go through the checkpoint.
  const auto trained = [&](const fs::path& out, bool signalled) {
    auto job = loom::build(model | loom::fsdp(), world());
    torch::optim::AdamW optimizer(job.trainable_parameters(), torch::optim::AdamWOptions(1e-2));
    const loom::train_result result = loom::train(job, optimizer,
                                                  {.loss =
                                                       [&](std::int64_t step, int) {
                                                         if (signalled && step == 2 && last_rank()) std::raise(SIGUSR1);
                                                         auto [x, y] = rows(step, 0, 4);
                                                         return job.forward(x, y);
                                                       }},
                                                  {.steps = 6, .out = out, .async_checkpoints = async_checkpoints});
    return std::pair{result, job.state_dict()};
  };
  const std::string name = async_checkpoints ? "preempted-async" : "preempted";
  const fs::path out = shared_scratch("train", name);
  const auto [stopped, ignored] = trained(out, true);
  CHECK(stopped.outcome == loom::train_outcome::preempted);
  CHECK(stopped.last_step == 2);
  // Preempted or not, every rank learns every rank's peak, each its own.
  REQUIRE(stopped.peak_memory_bytes.size() == static_cast<std::size_t>(world().world_size()));
  for (const std::int64_t bytes : stopped.peak_memory_bytes) CHECK(bytes > 0);
  CHECK(stopped.peak_memory_bytes[static_cast<std::size_t>(world().rank())] <=
        loom::peak_memory_bytes(world().device()));
  CHECK(fs::exists(out / "checkpoints" / "step-00000002" / "manifest.json"));

  const auto [resumed, resumed_state] = trained(out, false);
  CHECK(resumed.first_step == 3);
  CHECK(resumed.outcome == loom::train_outcome::finished);
  const auto [straight, straight_state] = trained(shared_scratch("train", name + "-straight"), false);
  REQUIRE(straight_state.size() == resumed_state.size());
  for (std::size_t i = 0; i < straight_state.size(); ++i) {
    CAPTURE(straight_state[i].name);
    CHECK(torch::equal(straight_state[i].tensor, resumed_state[i].tensor));
  }
}

TEST_CASE("a loss that is not finite on one rank stops every rank, naming the step", "[train]") {
  auto job = loom::build(model | loom::ddp(), world());
  torch::optim::SGD optimizer(job.trainable_parameters(), 0.1);
  CHECK_THROWS_WITH(loom::train(job, optimizer,
                                {.loss =
                                     [&](std::int64_t step, int) {
                                       auto [x, y] = rows(step, 0, 4);
                                       const at::Tensor loss = job.forward(x, y);
                                       const bool poisoned = step == 2 && last_rank();
                                       return poisoned ? loss * std::numeric_limits<double>::infinity() : loss;
                                     }},
                                {.steps = 4, .out = shared_scratch("train", "not-finite")}),
                    ContainsSubstring("the loss of step 2 is inf"));
}

TEST_CASE("loom::train reads the device on the host only to log: never in forward or backward, once a logged step",
          "[train][host_reads]") {
  const auto check_reads = [&](const auto& plan, const std::string& name) {
    CAPTURE(name);
    auto job = loom::build(plan, world());
    torch::optim::SGD optimizer(job.trainable_parameters(), 0.1);
    const loom::job_progress& progress = world().progress();
    std::vector<loom::host_read_counts> at_step_start;
    loom::train(job, optimizer,
                {.loss =
                     [&](std::int64_t step, int micro) {
                       if (micro == 0) at_step_start.push_back(progress.host_reads());
                       auto [x, y] = rows(step, 2 * micro, 2);
                       return job.forward(x, y);
                     }},
                {.steps = 7, .accumulate = 2, .clip_norm = 0.5, .log_every = 3, .log_seconds = 1e9});
    at_step_start.push_back(progress.host_reads());
    REQUIRE(at_step_start.size() == 8);
    for (std::size_t step = 1; step <= 7; ++step) {
      CAPTURE(step);
      const loom::host_read_counts& before = at_step_start[step - 1];
      const loom::host_read_counts& after = at_step_start[step];
      CHECK(after.forward == before.forward);
      CHECK(after.backward == before.backward);
      // The first step, every third and the last are logged: one read of the loss and the norm; after
      // the last, one more of the end of the run's summary (each rank's peak memory).
      const bool logged = step == 1 || step % 3 == 0 || step == 7;
      CHECK(after.between - before.between == (logged ? 1 : 0) + (step == 7 ? 1 : 0));
    }
  };
  check_reads(model | loom::local(), "local");
  check_reads(model | loom::ddp(), "ddp");
  check_reads(model | loom::lora(2, {"q_proj"}) | loom::ddp(), "lora | ddp");
  check_reads(model | loom::fsdp(), "fsdp");
  check_reads(model | loom::lora(2, {"q_proj"}) | loom::fsdp(), "lora | fsdp");
  check_reads(model | loom::fsdp({.shard_group_size = 1}), "hybrid");
  check_reads(model | loom::lora(2, {"q_proj"}) | loom::fsdp({.shard_group_size = 1}), "lora | hybrid");
}

namespace {

// The host reads of `loss_of`'s job over 4 steps of 2 micro-batches, each step's: the first and the
// last are logged (one read each, and after the last one of the run's summary), the two between must
// read nothing, in forward, backward or between.
template <class Job, class Loss>
void check_unlogged_steps_read_nothing(Job& job, const Loss& loss_of) {
  torch::optim::AdamW optimizer(job.trainable_parameters(), torch::optim::AdamWOptions(1e-3));
  const loom::job_progress& progress = world().progress();
  std::vector<loom::host_read_counts> at_step_start;
  loom::train(job, optimizer,
              {.loss =
                   [&](std::int64_t step, int micro) {
                     if (micro == 0) at_step_start.push_back(progress.host_reads());
                     return loss_of(step, micro);
                   }},
              {.steps = 4, .accumulate = 2, .clip_norm = 1.0, .log_every = 100, .log_seconds = 1e9});
  at_step_start.push_back(progress.host_reads());
  REQUIRE(at_step_start.size() == 5);
  for (std::size_t step = 1; step <= 4; ++step) {
    CAPTURE(step);
    const bool logged = step == 1 || step == 4;
    CHECK(at_step_start[step].total() - at_step_start[step - 1].total() == (logged ? 1 : 0) + (step == 4 ? 1 : 0));
  }
}

template <class Job>
at::Tensor llama_loss(Job& job, std::int64_t step, int micro, bool split) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(50 * static_cast<std::uint64_t>(step) +
                                                      10 * static_cast<std::uint64_t>(micro) +
                                                      static_cast<std::uint64_t>(job.data_rank()));
  const at::Tensor ids = loom::to_device(torch::randint(64, {2, 8}, gen, torch::kLong), world().device(), at::kLong);
  const at::Tensor logits = job.forward(ids);
  if (split) return loom::models::causal_lm_loss(logits, ids, job.module()->model->sequence);
  return loom::models::causal_lm_loss(logits, ids);
}

template <class Plan>
void check_llama(const Plan& plan, bool split, const std::string& name) {
  CAPTURE(name);
  auto job = loom::build(plan, world());
  check_unlogged_steps_read_nothing(job,
                                    [&](std::int64_t step, int micro) { return llama_loss(job, step, micro, split); });
}

}  // namespace

TEST_CASE("the real models' steps that are not logged read nothing on the host", "[train][host_reads]") {
  constexpr auto adapters = loom::lora(2, {"q_proj", "v_proj"});
  const auto llama = loom::model<loom::models::CausalLM>(small_llama()) | loom::seeded(3);
  const auto bf16 = loom::mixed_precision({.param = loom::bf16});
  check_llama(llama | adapters | bf16 | loom::fsdp(), false, "llama-lora-bf16-fsdp");
  check_llama(llama | adapters | loom::fsdp({.shard_group_size = 1}), false, "llama-lora-hybrid");
  if (world().world_size() % 2 == 0) {
    check_llama(llama | adapters | loom::sequence_parallel(2) | loom::fsdp(), true, "llama-lora-sequence-parallel-2");
  }

  // wan-lora-bf16-fsdp with flow matching: the noise and levels drawn on the device, from the step's generator.
  auto wan = loom::build(loom::model<loom::models::Wan>(small_wan()) | loom::seeded(3) |
                             loom::lora(2, {"to_q", "to_k", "to_v", "to_out.0"}) | bf16 | loom::fsdp(),
                         world());
  const loom::flow_matching method({.weighting_scheme = loom::timestep_density::logit_normal}, world().device());
  check_unlogged_steps_read_nothing(wan, [&](std::int64_t step, int micro) {
    at::Generator draws = loom::step_generator(7, step, world().rank(), micro, world().device());
    const at::Tensor x0 = torch::randn({1, 4, 2, 4, 4}, draws);
    const at::Tensor text = torch::randn({1, 5, 16}, draws);
    const loom::flow_matching_inputs inputs = method.noise(x0, draws);
    return loom::flow_matching::loss(wan.forward(inputs.noisy, inputs.timesteps, text), inputs);
  });
}

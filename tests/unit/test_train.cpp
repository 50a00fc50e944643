// loom::train on a single process: accumulation equals one big batch, the learning rate of each
// step, a loss that is not finite, preemption and resuming, metrics, the options' errors, and the
// recipes' data order.
#include <loom/loom.hpp>
#include <loom/train/loop.hpp>
#include <models/text_data.hpp>
#include <models/tiny_gpt.hpp>

#include <torch/optim/sgd.h>
#include <nlohmann/json.hpp>

#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <set>
#include <string>
#include <vector>

using Catch::Matchers::ContainsSubstring;

namespace {

namespace fs = std::filesystem;

constexpr models::tiny_gpt_config small{.vocab = 32, .d = 16, .layers = 2, .heads = 2, .ctx = 8};

loom::runtime one() { return loom::runtime::single_process(); }

fs::path scratch(const std::string& name) {
  const fs::path folder = fs::temp_directory_path() / "loom-test-train" / name;
  fs::remove_all(folder);
  return folder;
}

// The rows [first, first + count) of step `step`'s batch of 4.
std::pair<at::Tensor, at::Tensor> rows(std::int64_t step, std::int64_t first, std::int64_t count) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<std::uint64_t>(step));
  const at::Tensor x = torch::randint(0, small.vocab, {4, small.ctx}, gen);
  return {x.narrow(0, first, count), x.roll(-1, 1).narrow(0, first, count)};
}

constexpr auto plan = loom::model<models::TinyGpt>(small) | loom::seeded(1);

std::vector<nlohmann::json> metrics(const fs::path& out) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(out / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

}  // namespace

TEST_CASE("two micro-batches a step equal one batch of both", "[train]") {
  auto whole = loom::build(plan, one());
  auto halves = loom::build(plan, one());
  torch::optim::SGD whole_optimizer(whole.trainable_parameters(), 0.1);
  torch::optim::SGD halves_optimizer(halves.trainable_parameters(), 0.1);
  loom::train(whole, whole_optimizer,
              {.loss =
                   [&](std::int64_t step, int) {
                     auto [x, y] = rows(step, 0, 4);
                     return whole.forward(x, y);
                   }},
              {.steps = 3, .out = scratch("whole")});
  loom::train(halves, halves_optimizer,
              {.loss =
                   [&](std::int64_t step, int micro) {
                     auto [x, y] = rows(step, 2 * micro, 2);
                     return halves.forward(x, y);
                   }},
              {.steps = 3, .accumulate = 2, .out = scratch("halves")});
  const auto a = whole.state_dict(), b = halves.state_dict();
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(torch::allclose(a[i].tensor, b[i].tensor, 1e-5, 1e-6));
}

TEST_CASE("each step has the schedule's learning rate, and metrics.jsonl says so", "[train]") {
  auto job = loom::build(plan, one());
  torch::optim::SGD optimizer(job.trainable_parameters(), 1.0);
  const loom::lr_schedule lr{.peak = 0.1, .warmup_steps = 2, .decay_steps = 2, .total_steps = 6, .floor = 0.5};
  const fs::path out = scratch("lr");
  loom::train(job, optimizer,
              {.loss =
                   [&](std::int64_t step, int) {
                     auto [x, y] = rows(step, 0, 4);
                     return job.forward(x, y);
                   },
               .eval_loss =
                   [&] {
                     auto [x, y] = rows(1000, 0, 4);
                     return job.forward(x, y);
                   }},
              {.steps = 6,
               .clip_norm = 1.0,
               .lr = lr,
               .out = out,
               .eval_every = 3,
               .log_every = 1,
               .tokens_per_micro_batch = 4 * small.ctx});
  const auto lines = metrics(out);
  std::vector<double> rates;
  int evals = 0;
  for (const auto& line : lines) {
    if (line.contains("eval_loss")) {
      ++evals;
      continue;
    }
    rates.push_back(line["lr"].get<double>());
    CHECK(line.contains("grad_norm"));
    CHECK(line["tokens_per_s"].get<double>() > 0);
    CHECK(std::isfinite(line["loss"].get<double>()));
  }
  REQUIRE(rates.size() == 6);
  for (std::size_t i = 0; i < rates.size(); ++i) CHECK(rates[i] == Catch::Approx(lr.at(static_cast<int>(i) + 1)));
  CHECK(evals == 2);
  CHECK(optimizer.param_groups().front().options().get_lr() == Catch::Approx(lr.at(6)));
}

TEST_CASE("the result and out/summary.json give the run's time, best and last evaluation, and peak memory", "[train]") {
  auto job = loom::build(plan, one());
  torch::optim::SGD optimizer(job.trainable_parameters(), 0.1);
  const fs::path out = scratch("summary");
  // Evaluations that fall, then rise: the best is not the last.
  const std::vector<double> eval_losses{3.0, 1.0, 2.0, 0.5};
  std::size_t evaluations = 0;
  const auto run = [&](std::int64_t steps) {
    return loom::train(job, optimizer,
                       {.loss =
                            [&](std::int64_t step, int) {
                              auto [x, y] = rows(step, 0, 4);
                              return job.forward(x, y);
                            },
                        .eval_loss = [&] { return torch::tensor(eval_losses.at(evaluations++)); }},
                       {.steps = steps, .out = out, .eval_every = 2});
  };
  const loom::train_result first = run(6);
  REQUIRE(first.best_eval.has_value());
  CHECK(first.best_eval->step == 4);
  CHECK(first.best_eval->loss == 1.0);
  CHECK(first.last_eval->step == 6);
  CHECK(first.last_eval->loss == 2.0);
  CHECK(first.seconds > 0);
  REQUIRE(first.peak_memory_bytes.size() == 1);
  CHECK(first.peak_memory_bytes[0] > 0);
  const auto summary_of = [&] { return nlohmann::json::parse(std::ifstream(out / "summary.json")); };
  const nlohmann::json written = summary_of();
  CHECK(written["finished"] == true);
  CHECK(written["first_step"] == 1);
  CHECK(written["last_step"] == 6);
  CHECK(written["best_eval"] == nlohmann::json{{"step", 4}, {"loss", 1.0}});
  CHECK(written["last_eval"] == nlohmann::json{{"step", 6}, {"loss", 2.0}});
  CHECK(written["peak_memory_bytes"][0] == first.peak_memory_bytes[0]);
  // Continued to step 8: the summary is the resumed run's own.
  const loom::train_result second = run(8);
  CHECK(second.first_step == 7);
  CHECK(second.best_eval->step == 8);
  CHECK(second.best_eval->loss == 0.5);
  CHECK(summary_of()["first_step"] == 7);
  // A run without evaluations has none to report.
  const loom::train_result plain = loom::train(job, optimizer,
                                               {.loss =
                                                    [&](std::int64_t step, int) {
                                                      auto [x, y] = rows(step, 0, 4);
                                                      return job.forward(x, y);
                                                    }},
                                               {.steps = 2});
  CHECK(!plain.best_eval.has_value());
  CHECK(plain.peak_memory_bytes.size() == 1);
}

TEST_CASE("a loss that is not finite stops the run before its update; the last good checkpoint stays", "[train]") {
  auto job = loom::build(plan, one());
  torch::optim::SGD optimizer(job.trainable_parameters(), 0.1);
  const fs::path out = scratch("nan");
  CHECK_THROWS_WITH(loom::train(job, optimizer,
                                {.loss =
                                     [&](std::int64_t step, int) {
                                       auto [x, y] = rows(step, 0, 4);
                                       const at::Tensor loss = job.forward(x, y);
                                       return step == 3 ? loss * std::numeric_limits<double>::quiet_NaN() : loss;
                                     }},
                                {.steps = 5, .out = out, .checkpoint_every = 1}),
                    ContainsSubstring("the loss of step 3 is nan") && ContainsSubstring("last good state"));
  CHECK(fs::exists(out / "checkpoints" / "step-00000002"));
  CHECK_FALSE(fs::exists(out / "checkpoints" / "step-00000003"));
}

TEST_CASE("on_nonfinite skip: a step whose loss is not finite takes no update and no rate step; past the limit, stops",
          "[train]") {
  const auto trained = [&](std::int64_t steps, const fs::path& out, const std::set<std::int64_t>& poisoned,
                           auto batch_of) {
    auto job = loom::build(plan, one());
    torch::optim::SGD optimizer(job.trainable_parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    loom::train(job, optimizer,
                {.loss =
                     [&](std::int64_t step, int) {
                       auto [x, y] = rows(batch_of(step), 0, 4);
                       const at::Tensor loss = job.forward(x, y);
                       return poisoned.contains(step) ? loss * std::numeric_limits<double>::infinity() : loss;
                     }},
                {.steps = steps,
                 .clip_norm = 1.0,
                 .lr = loom::lr_schedule{.peak = 0.1, .warmup_steps = 4, .total_steps = steps},
                 .out = out,
                 .log_every = 1,
                 .on_nonfinite = loom::nonfinite_policy::skip,
                 .max_skipped_steps = 2});
    return job.state_dict();
  };
  const fs::path out = scratch("skip");
  const auto skipped = trained(7, out, {2, 5}, [](std::int64_t step) { return step; });
  const auto straight =
      trained(5, scratch("skip-straight"), {}, [](std::int64_t step) { return step + (step >= 2) + (step >= 4); });
  for (std::size_t i = 0; i < skipped.size(); ++i) {
    CAPTURE(skipped[i].name);
    CHECK(torch::equal(skipped[i].tensor, straight[i].tensor));
  }
  std::vector<std::int64_t> skips;
  for (const auto& line : metrics(out)) {
    if (line.contains("skipped")) {
      skips.push_back(line["step"].get<std::int64_t>());
      CHECK(line["rank"] == 0);
      CHECK(line["skipped_steps"] == skips.size());
    } else {
      CHECK(std::isfinite(line["loss"].get<double>()));
    }
  }
  CHECK(skips == std::vector<std::int64_t>{2, 5});
  CHECK_THROWS_WITH(trained(7, scratch("skip-too-many"), {2, 3, 5}, [](std::int64_t step) { return step; }),
                    ContainsSubstring("the loss of step 5 is inf (averaged over the ranks), not finite on rank 0") &&
                        ContainsSubstring("it would be skip 3 of a run that allows 2") &&
                        ContainsSubstring("before the update of step 5"));
}

TEST_CASE("the data's position is saved with each checkpoint and put back on resume; one function alone is refused",
          "[train]") {
  const fs::path out = scratch("data-position");
  std::int64_t drawn = 0;  // a data source whose position is the number of batches drawn
  std::vector<std::int64_t> batches;
  const auto run = [&](std::int64_t steps, bool preempt) {
    auto job = loom::build(plan, one());
    torch::optim::SGD optimizer(job.trainable_parameters(), 0.1);
    return loom::train(job, optimizer,
                       {.loss =
                            [&](std::int64_t step, int) {
                              if (preempt && step == 3) std::raise(SIGUSR1);
                              batches.push_back(drawn);
                              auto [x, y] = rows(drawn++, 0, 4);
                              return job.forward(x, y);
                            },
                        .data_state = [&] { return "drawn " + std::to_string(drawn); },
                        .restore_data =
                            [&](const std::string& state) {
                              REQUIRE(state.starts_with("drawn "));
                              drawn = std::stoll(state.substr(6));
                            }},
                       {.steps = steps, .accumulate = 2, .out = out});
  };
  CHECK(run(6, true).outcome == loom::train_outcome::preempted);
  drawn = 100;  // a new process starts its data at the beginning, or anywhere: the checkpoint says where
  CHECK(run(6, false).first_step == 4);
  CHECK(batches == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});

  auto job = loom::build(plan, one());
  torch::optim::SGD optimizer(job.trainable_parameters(), 0.1);
  CHECK_THROWS_WITH(
      loom::train(job, optimizer,
                  {.loss = [&](std::int64_t, int) { return at::Tensor(); }, .data_state = [] { return std::string(); }},
                  {.steps = 1}),
      ContainsSubstring("train_functions.data_state is set and restore_data is not"));
}

TEST_CASE("SIGUSR1 ends the run after the step under way, with a checkpoint; the next run resumes", "[train]") {
  const fs::path out = scratch("preempted");
  const auto loss_of = [](auto& job, std::int64_t step, bool signal) {
    if (signal && step == 2) std::raise(SIGUSR1);
    auto [x, y] = rows(step, 0, 4);
    return job.forward(x, y);
  };
  auto first = loom::build(plan, one());
  torch::optim::SGD first_optimizer(first.trainable_parameters(), 0.1);
  const loom::train_result stopped =
      loom::train(first, first_optimizer, {.loss = [&](std::int64_t step, int) { return loss_of(first, step, true); }},
                  {.steps = 5, .out = out});
  CHECK(stopped.outcome == loom::train_outcome::preempted);
  CHECK(stopped.last_step == 2);
  CHECK(fs::exists(out / "checkpoints" / "step-00000002"));

  auto second = loom::build(plan, one());
  torch::optim::SGD second_optimizer(second.trainable_parameters(), 0.1);
  const loom::train_result resumed = loom::train(
      second, second_optimizer, {.loss = [&](std::int64_t step, int) { return loss_of(second, step, false); }},
      {.steps = 5, .out = out});
  CHECK(resumed.outcome == loom::train_outcome::finished);
  CHECK(resumed.first_step == 3);
  CHECK(resumed.last_step == 5);

  auto straight = loom::build(plan, one());
  torch::optim::SGD straight_optimizer(straight.trainable_parameters(), 0.1);
  loom::train(straight, straight_optimizer,
              {.loss = [&](std::int64_t step, int) { return loss_of(straight, step, false); }},
              {.steps = 5, .out = scratch("straight")});
  const auto a = straight.state_dict(), b = second.state_dict();
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(torch::equal(a[i].tensor, b[i].tensor));

  // Fewer steps than the checkpoint has: said, with what to do, and nothing trained or saved.
  auto fewer = loom::build(plan, one());
  torch::optim::SGD fewer_optimizer(fewer.trainable_parameters(), 0.1);
  CHECK_THROWS_WITH(
      loom::train(fewer, fewer_optimizer, {.loss = [&](std::int64_t step, int) { return loss_of(fewer, step, false); }},
                  {.steps = 3, .out = out}),
      ContainsSubstring(
          "is at step 5, past this run's 3 steps, so there is nothing to train: give more steps than 5") &&
          ContainsSubstring("or remove '" + (out / "checkpoints").string() + "') to train 3 steps afresh"));
  CHECK_FALSE(fs::exists(out / "checkpoints" / "step-00000003"));
  // More steps go on from it.
  auto more = loom::build(plan, one());
  torch::optim::SGD more_optimizer(more.trainable_parameters(), 0.1);
  const loom::train_result further =
      loom::train(more, more_optimizer, {.loss = [&](std::int64_t step, int) { return loss_of(more, step, false); }},
                  {.steps = 7, .out = out});
  CHECK(further.first_step == 6);
  CHECK(further.last_step == 7);
}

TEST_CASE("the loop's options are checked before the first step, naming the option", "[train][errors]") {
  auto job = loom::build(plan, one());
  torch::optim::SGD optimizer(job.trainable_parameters(), 0.1);
  const loom::train_functions functions{.loss = [&](std::int64_t step, int) {
    auto [x, y] = rows(step, 0, 4);
    return job.forward(x, y);
  }};
  CHECK_THROWS_WITH(loom::train(job, optimizer, functions, {.steps = 0, .out = scratch("x")}),
                    ContainsSubstring("train_options.steps is 0"));
  CHECK_THROWS_WITH(loom::train(job, optimizer, functions, {.steps = 2, .accumulate = 0, .out = scratch("x")}),
                    ContainsSubstring("train_options.accumulate is 0"));
  CHECK_THROWS_WITH(loom::train(job, optimizer, functions,
                                {.steps = 2, .lr = loom::lr_schedule{.total_steps = 3}, .out = scratch("x")}),
                    ContainsSubstring("train_options.lr.total_steps (3) differs from train_options.steps (2)"));
  CHECK_THROWS_WITH(loom::train(job, optimizer, functions, {.steps = 2, .out = "/sys/kernel/loom-run"}),
                    ContainsSubstring("the output folder '/sys/kernel/loom-run' cannot be created"));
}

TEST_CASE("without a run folder the loop writes nothing, and reports every step", "[train]") {
  auto job = loom::build(plan, one());
  torch::optim::SGD optimizer(job.trainable_parameters(), 0.1);
  std::vector<loom::step_report> reports;
  const auto result = loom::train(job, optimizer,
                                  {.loss =
                                       [&](std::int64_t step, int) {
                                         auto [x, y] = rows(step, 0, 4);
                                         return job.forward(x, y);
                                       },
                                   .on_step = [&](const loom::step_report& report) { reports.push_back(report); }},
                                  {.steps = 3, .set_to_none = false});
  CHECK(result.outcome == loom::train_outcome::finished);
  REQUIRE(reports.size() == 3);
  for (std::int64_t step = 1; step <= 3; ++step) {
    const loom::step_report& report = reports[static_cast<std::size_t>(step - 1)];
    CHECK(report.step == step);
    CHECK(report.loss == report.rank_loss);  // one rank
    CHECK(report.step_ms > 0);
  }
  CHECK(reports[0].loss != reports[2].loss);
  for (const at::Tensor& p : job.trainable_parameters()) {  // zeroed, kept: set_to_none = false
    REQUIRE(p.grad().defined());
    CHECK(p.grad().abs().sum().item<double>() == 0);
  }
}

TEST_CASE("the recipes' batches: each rank its own share, a function of (seed, rank, epoch, step)", "[train][data]") {
  const at::Tensor text = torch::arange(10'000, torch::kLong);  // a token's value is its position
  constexpr std::int64_t batch = 4;
  constexpr std::int64_t context = 16;
  const auto starts = [&](const text_data::batch_sampler& sampler, std::int64_t step) {
    const auto [x, y] = sampler.at_step(step);
    CHECK(torch::equal(y, x + 1));
    std::set<std::int64_t> first;
    for (std::int64_t i = 0; i < batch; ++i) first.insert(x[i][0].item<std::int64_t>());
    return first;
  };
  const text_data::batch_sampler rank0(text, 7, 0, 3, batch, context);
  const text_data::batch_sampler rank1(text, 7, 1, 3, batch, context);
  const text_data::batch_sampler again(text, 7, 0, 3, batch, context);
  const text_data::batch_sampler other_seed(text, 8, 0, 3, batch, context);
  // 10000 tokens hold 623 windows of 16: 208 a rank, 52 steps an epoch.
  std::set<std::int64_t> seen0, seen1;
  for (std::int64_t step = 0; step < 52; ++step) {
    const auto a = starts(rank0, step);
    CHECK(a == starts(again, step));  // nothing to save: the same step draws the same batch
    seen0.insert(a.begin(), a.end());
    const auto b = starts(rank1, step);
    seen1.insert(b.begin(), b.end());
  }
  CHECK(seen0.size() == 208);  // an epoch is one pass over the rank's share
  std::vector<std::int64_t> shared;
  std::set_intersection(seen0.begin(), seen0.end(), seen1.begin(), seen1.end(), std::back_inserter(shared));
  CHECK(shared.empty());                         // the ranks' shares are apart
  CHECK(starts(rank0, 0) != starts(rank0, 52));  // the next epoch: other windows, another order
  CHECK(starts(rank0, 0) != starts(other_seed, 0));
  CHECK_THROWS_WITH(text_data::batch_sampler(text.narrow(0, 0, 150), 7, 0, 3, batch, context),
                    ContainsSubstring("fewer than a batch of 4 for each of 3 ranks"));
}

// The learning-rate schedule: warmup, stable, decay to a floor, as pure functions of the step.
#include <loom/train/lr_schedule.hpp>

#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <numbers>

using Catch::Approx;
using Catch::Matchers::ContainsSubstring;

TEST_CASE("warmup rises linearly, the stable stretch holds the peak, the decay ends at the floor", "[lr]") {
  const loom::lr_schedule linear{.peak = 1.0,
                                 .warmup_steps = 3,
                                 .decay_steps = 4,
                                 .total_steps = 10,
                                 .decay = loom::decay_shape::linear,
                                 .floor = 0.2};
  CHECK(linear.at(1) == Approx(0.25));
  CHECK(linear.at(3) == Approx(0.75));
  CHECK(linear.at(4) == Approx(1.0));
  CHECK(linear.at(6) == Approx(1.0));
  CHECK(linear.at(7) == Approx(0.2 + 0.8 * 0.75));
  CHECK(linear.at(8) == Approx(0.2 + 0.8 * 0.5));
  CHECK(linear.at(10) == Approx(0.2));

  loom::lr_schedule cosine = linear;
  cosine.decay = loom::decay_shape::cosine;
  CHECK(cosine.at(6) == Approx(1.0));
  CHECK(cosine.at(8) == Approx(0.2 + 0.8 * 0.5 * (1 + std::cos(std::numbers::pi * 0.5))));
  CHECK(cosine.at(10) == Approx(0.2));

  const loom::lr_schedule constant{.peak = 0.5, .total_steps = 5};
  for (int step = 1; step <= 5; ++step) CHECK(constant.at(step) == 0.5);
}

TEST_CASE("a schedule out of range names the field", "[lr][errors]") {
  CHECK_THROWS_WITH((loom::lr_schedule{.peak = 0, .total_steps = 5}.at(1)), ContainsSubstring("peak is 0"));
  CHECK_THROWS_WITH((loom::lr_schedule{.total_steps = 0}.at(1)), ContainsSubstring("total_steps is 0"));
  CHECK_THROWS_WITH((loom::lr_schedule{.warmup_steps = 4, .decay_steps = 3, .total_steps = 5}.at(1)),
                    ContainsSubstring("warmup_steps (4) and decay_steps (3) add up to more than total_steps (5)"));
  CHECK_THROWS_WITH((loom::lr_schedule{.total_steps = 5, .floor = 1.5}.at(1)), ContainsSubstring("floor is 1.5"));
  CHECK_THROWS_WITH((loom::lr_schedule{.total_steps = 5}.at(6)), ContainsSubstring("step 6 is outside 1 … 5"));
}

TEST_CASE("lengths given as fractions of the steps scale with them and always fit", "[lr]") {
  // lm_finetune.toml's shape: a tenth of warmup, the rest decaying.
  loom::lr_schedule fractions{
      .peak = 1.0, .total_steps = 60, .warmup_ratio = 0.1, .decay_ratio = 0.9, .decay = loom::decay_shape::linear};
  CHECK(fractions.warmup_length() == 6);
  CHECK(fractions.decay_length() == 54);
  fractions.total_steps = 300;  // 0.1 · 300 is 30.000000000000004 in floating point
  CHECK(fractions.warmup_length() == 30);
  CHECK(fractions.decay_length() == 270);
  fractions.total_steps = 60;
  const loom::lr_schedule absolute{
      .peak = 1.0, .warmup_steps = 6, .decay_steps = 54, .total_steps = 60, .decay = loom::decay_shape::linear};
  for (int step = 1; step <= 60; ++step) CHECK(fractions.at(step) == absolute.at(step));
  // A short trial run: warmup rounds up (as transformers' warmup_ratio), decay down (as
  // torchtitan's decay_ratio), so that together they never outgrow the run.
  for (const std::int64_t steps : {1, 2, 3, 5, 7, 11, 101}) {
    fractions.total_steps = steps;
    INFO("steps " << steps);
    CHECK(fractions.warmup_length() == (steps + 9) / 10);
    CHECK(fractions.warmup_length() + fractions.decay_length() <= steps);
    CHECK_NOTHROW(fractions.at(steps));
    CHECK(fractions.at(steps) == Approx(0.0).margin(steps > 1 ? 1e-12 : 1.0));
  }
  const loom::lr_schedule warmup_only{.peak = 2.0, .total_steps = 10, .warmup_ratio = 0.25};
  CHECK(warmup_only.warmup_length() == 3);
  CHECK(warmup_only.at(3) == Approx(1.5));
  CHECK(warmup_only.at(4) == 2.0);
}

TEST_CASE("fractions out of range, or given with the length they replace, name the field", "[lr][errors]") {
  CHECK_THROWS_WITH((loom::lr_schedule{.total_steps = 5, .warmup_ratio = 1.5}.at(1)),
                    ContainsSubstring("warmup_ratio is 1.5; give a fraction of the steps in [0, 1]"));
  CHECK_THROWS_WITH((loom::lr_schedule{.total_steps = 5, .decay_ratio = -0.1}.at(1)),
                    ContainsSubstring("decay_ratio is -0.1"));
  CHECK_THROWS_WITH(
      (loom::lr_schedule{.warmup_steps = 2, .total_steps = 5, .warmup_ratio = 0.1}.at(1)),
      ContainsSubstring("warmup_ratio (0.1) and warmup_steps (2) both give the length; give one of them"));
  CHECK_THROWS_WITH((loom::lr_schedule{.total_steps = 10, .warmup_ratio = 0.5, .decay_ratio = 0.6}.at(1)),
                    ContainsSubstring("warmup_ratio gives a warmup of 5 steps and a decay of 6, more than total_steps "
                                      "(10); give warmup_ratio and decay_ratio that add up to 1 or less"));
}

TEST_CASE("the rate goes to every parameter group", "[lr]") {
  torch::nn::Linear a(2, 2), b(2, 2);
  torch::optim::AdamW optimizer(
      {torch::optim::OptimizerParamGroup(a->parameters()), torch::optim::OptimizerParamGroup(b->parameters())});
  loom::apply_learning_rate(optimizer, 0.125);
  for (const auto& group : optimizer.param_groups()) CHECK(group.options().get_lr() == 0.125);
}

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

TEST_CASE("the rate goes to every parameter group", "[lr]") {
  torch::nn::Linear a(2, 2), b(2, 2);
  torch::optim::AdamW optimizer(
      {torch::optim::OptimizerParamGroup(a->parameters()), torch::optim::OptimizerParamGroup(b->parameters())});
  loom::apply_learning_rate(optimizer, 0.125);
  for (const auto& group : optimizer.param_groups()) CHECK(group.options().get_lr() == 0.125);
}

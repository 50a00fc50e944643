// fsdp() across real processes: parity with one process (local()) and with ddp() on a model whose
// sizes do not divide by the world size; replicated LoRA adapters over the sharded base, with a
// rank that skips an adapted layer or a unit's output; no_sync and the memory it holds; the order
// of collectives under random delays; clipping; state; merge; memory at rest.
#include "delayed_order.hpp"
#include "heap.hpp"
#include "hooked_units.hpp"
#include "odd_units.hpp"
#include "same_state.hpp"
#include "training_state.hpp"
#include "world.hpp"

#include <loom/loom.hpp>

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_exception.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

using Catch::Matchers::ContainsSubstring;
using loom::testing::check_same_state;
using loom::testing::heap_in_use;
using loom::testing::hooked_units;
using loom::testing::odd_units;
using loom::testing::training_state_bytes;
using loom::testing::world;

namespace {

constexpr std::int64_t rows_per_rank = 3;

std::int64_t all_rows() { return rows_per_rank * world().world_size(); }
at::Tensor my_rows(const at::Tensor& full) { return full.narrow(0, world().rank() * rows_per_rank, rows_per_rank); }

struct batch {
  at::Tensor x, y;
};

batch data(int step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(300 + step);
  return {torch::randn({all_rows(), 5}, gen), torch::randn({all_rows(), 3}, gen)};
}

// The mean loss over this rank's rows, scaled so that the ranks' average is the whole batch's loss.
template <class Job>
at::Tensor loss_on(Job& job, const batch& b, bool whole) {
  return whole ? torch::mse_loss(job.forward(b.x), b.y) : torch::mse_loss(job.forward(my_rows(b.x)), my_rows(b.y));
}

enum class optimizer_kind { adamw, sgd };

std::unique_ptr<torch::optim::Optimizer> make_optimizer(optimizer_kind kind, std::vector<at::Tensor> parameters) {
  if (kind == optimizer_kind::sgd) return std::make_unique<torch::optim::SGD>(std::move(parameters), 0.1);
  return std::make_unique<torch::optim::AdamW>(std::move(parameters), torch::optim::AdamWOptions(1e-2));
}

// Five steps of each, from the same seeded start: `reference` on the whole batch (local()) or its
// rows (ddp()), `sharded` on this rank's rows. SGD shows a gradient off by a factor, which AdamW,
// invariant to the gradient's scale, would hide.
template <class Reference, class Sharded>
void train_side_by_side(Reference& reference, Sharded& sharded, bool reference_whole,
                        optimizer_kind kind = optimizer_kind::adamw) {
  auto reference_optimizer_ptr = make_optimizer(kind, reference.trainable_parameters());
  auto sharded_optimizer_ptr = make_optimizer(kind, sharded.trainable_parameters());
  torch::optim::Optimizer& reference_optimizer = *reference_optimizer_ptr;
  torch::optim::Optimizer& sharded_optimizer = *sharded_optimizer_ptr;
  for (int step = 0; step < 5; ++step) {
    const batch b = data(step);
    reference.backward(loss_on(reference, b, reference_whole));
    reference_optimizer.step();
    reference.zero_grad();
    sharded.backward(loss_on(sharded, b, false));
    sharded_optimizer.step();
    sharded.zero_grad();
  }
}

}  // namespace

TEST_CASE("fsdp: N ranks with 1/N of the batch each equal one process on the whole batch", "[fsdp][parity]") {
  const bool reshard = GENERATE(true, false);
  const auto kind = GENERATE(optimizer_kind::adamw, optimizer_kind::sgd);
  CAPTURE(reshard, kind == optimizer_kind::sgd);
  auto reference = loom::build(loom::model<odd_units>() | loom::seeded(5) | loom::local(), world());
  auto sharded =
      loom::build(loom::model<odd_units>() | loom::seeded(5) | loom::fsdp({.reshard_after_forward = reshard}), world());
  train_side_by_side(reference, sharded, /*reference_whole=*/true, kind);
  check_same_state(reference, sharded, 1e-5);
}

namespace {

struct HeldOddUnitsImpl : odd_units {};
TORCH_MODULE(HeldOddUnits);

template <class Model>
at::Tensor forward_of(Model& model, const at::Tensor& x) {
  if constexpr (requires { model->forward(x); }) {
    return model->forward(x);
  } else {
    return model.forward(x);
  }
}

// The model called directly under fsdp(): refused with loom's sentence outside with_whole_module,
// the replica's output inside it (on each rank's own rows), and training goes on as ddp()'s after.
template <class Model>
void call_the_model_yourself() {
  auto replicated = loom::build(loom::model<Model>() | loom::seeded(21) | loom::ddp(), world());
  auto sharded = loom::build(loom::model<Model>() | loom::seeded(21) | loom::fsdp(), world());
  train_side_by_side(replicated, sharded, /*reference_whole=*/false);
  const at::Tensor x = my_rows(data(40 + world().rank()).x);
  CHECK_THROWS_MATCHES(
      forward_of(sharded.module(), x), loom::nn::parameters_at_rest,
      Catch::Matchers::MessageMatches(
          ContainsSubstring("loom::nn::Linear: its weight holds no bytes, because the strategy (fsdp()) shards it") &&
          ContainsSubstring("job.with_whole_module")));
  {
    const torch::NoGradGuard no_grad;
    const at::Tensor whole = sharded.with_whole_module([&](Model& model) { return forward_of(model, x); });
    CHECK(torch::allclose(whole, forward_of(replicated.module(), x), 1e-6, 1e-6));
  }
  train_side_by_side(replicated, sharded, /*reference_whole=*/false);
  check_same_state(replicated, sharded, 1e-5);
}

}  // namespace

TEST_CASE("the model called yourself under fsdp(): a sentence outside with_whole_module, the replica's inside",
          "[fsdp]") {
  SECTION("a Module subclass") { call_the_model_yourself<odd_units>(); }
  SECTION("a TORCH_MODULE holder") { call_the_model_yourself<HeldOddUnits>(); }
}

TEST_CASE("fsdp equals ddp on the same rows", "[fsdp][parity]") {
  auto replicated = loom::build(loom::model<odd_units>() | loom::seeded(6) | loom::ddp(), world());
  auto sharded = loom::build(loom::model<odd_units>() | loom::seeded(6) | loom::fsdp(), world());
  train_side_by_side(replicated, sharded, /*reference_whole=*/false);
  check_same_state(replicated, sharded, 1e-5);
}

TEST_CASE("lora | fsdp equals lora | local: adapters replicated over the sharded base", "[fsdp][lora]") {
  constexpr auto adapters = loom::seeded(7) | loom::lora(2, {"up", "out"});
  auto reference = loom::build(loom::model<odd_units>() | adapters | loom::local(), world());
  auto sharded = loom::build(loom::model<odd_units>() | adapters | loom::fsdp(), world());
  CHECK(sharded.trainable_parameters().size() == 8);  // lora_A and lora_B of 3 blocks' up and of out
  train_side_by_side(reference, sharded, /*reference_whole=*/true, optimizer_kind::sgd);
  check_same_state(reference, sharded, 1e-5);
}

TEST_CASE("a rank that skips an adapted layer: no hang, adapters equal ddp with find_unused_parameters",
          "[fsdp][lora][unused]") {
  // A model whose last block's adapted layer the last rank leaves out in step 2.
  struct skipping : odd_units {
    at::Tensor forward(const at::Tensor& x, bool skip) {
      at::Tensor h = in(x);
      for (std::size_t i = 0; i < blocks->size(); ++i) {
        h = blocks[i]->as<Block>()->forward(h, !(skip && i + 1 == blocks->size()));
      }
      return out(h);
    }
  };
  constexpr auto adapters = loom::seeded(8) | loom::lora(2, {"up"});
  auto replicated =
      loom::build(loom::model<skipping>() | adapters | loom::ddp({.find_unused_parameters = true}), world());
  auto sharded = loom::build(loom::model<skipping>() | adapters | loom::fsdp(), world());
  torch::optim::SGD replicated_optimizer(replicated.trainable_parameters(), 0.1);
  torch::optim::SGD sharded_optimizer(sharded.trainable_parameters(), 0.1);
  const bool last = world().rank() == world().world_size() - 1;
  // SGD: a zero-filled share must count as zero in the average, not shrink it by another factor.
  for (int step = 0; step < 4; ++step) {
    const batch b = data(step);
    const bool skip = last && step == 2;
    replicated.backward(torch::mse_loss(replicated.forward(my_rows(b.x), skip), my_rows(b.y)));
    replicated_optimizer.step();
    replicated.zero_grad();
    sharded.backward(torch::mse_loss(sharded.forward(my_rows(b.x), skip), my_rows(b.y)));
    sharded_optimizer.step();
    sharded.zero_grad();
  }
  check_same_state(replicated, sharded, 1e-5);
}

TEST_CASE("a rank whose loss leaves out the last unit's output: the ranks' collectives keep their order",
          "[fsdp][unused]") {
  // The last rank's loss in step 1 reads the second unit's output, not the third's: that rank's
  // backward never reaches the third unit, so the hook that would issue its collectives does not fire
  // there, and the schedule's order must hold all the same.
  struct early_exit : odd_units {
    at::Tensor forward(const at::Tensor& x, bool exit_early) {
      at::Tensor h = in(x);
      at::Tensor before_last;
      for (std::size_t i = 0; i < blocks->size(); ++i) {
        if (i + 1 == blocks->size()) before_last = h;
        h = blocks[i]->as<Block>()->forward(h);
      }
      return out(exit_early ? before_last : h);
    }
  };
  const bool reshard = GENERATE(true, false);
  CAPTURE(reshard);
  auto replicated =
      loom::build(loom::model<early_exit>() | loom::seeded(14) | loom::ddp({.find_unused_parameters = true}), world());
  auto sharded = loom::build(
      loom::model<early_exit>() | loom::seeded(14) | loom::fsdp({.reshard_after_forward = reshard}), world());
  torch::optim::SGD replicated_optimizer(replicated.trainable_parameters(), 0.1);
  torch::optim::SGD sharded_optimizer(sharded.trainable_parameters(), 0.1);
  const bool last = world().rank() == world().world_size() - 1;
  for (int step = 0; step < 3; ++step) {
    const batch b = data(step);
    const bool exit_early = last && step == 1;
    replicated.backward(torch::mse_loss(replicated.forward(my_rows(b.x), exit_early), my_rows(b.y)));
    replicated_optimizer.step();
    replicated.zero_grad();
    sharded.backward(torch::mse_loss(sharded.forward(my_rows(b.x), exit_early), my_rows(b.y)));
    sharded_optimizer.step();
    sharded.zero_grad();
  }
  check_same_state(replicated, sharded, 1e-5);
}

TEST_CASE("fsdp no_sync: micro-batches accumulated on N ranks equal one process on the whole batches",
          "[fsdp][no_sync]") {
  const bool reshard = GENERATE(true, false);
  const bool unsharded = GENERATE(false, true);
  CAPTURE(reshard, unsharded);
  auto reference = loom::build(loom::model<odd_units>() | loom::seeded(15) | loom::local(), world());
  auto sharded = loom::build(loom::model<odd_units>() | loom::seeded(15) |
                                 loom::fsdp({.reshard_after_forward = reshard, .accumulate_unsharded = unsharded}),
                             world());
  torch::optim::SGD reference_optimizer(reference.trainable_parameters(), 0.1);
  torch::optim::SGD sharded_optimizer(sharded.trainable_parameters(), 0.1);
  for (int step = 0; step < 2; ++step) {
    // Three micro-batches a step, the first two without synchronisation.
    for (int micro = 0; micro < 3; ++micro) {
      const batch b = data(10 * step + micro);
      reference.backward(loss_on(reference, b, true));
      if (micro < 2) {
        auto accumulate = sharded.no_sync();
        sharded.backward(loss_on(sharded, b, false));
      } else {
        sharded.backward(loss_on(sharded, b, false));
      }
    }
    reference_optimizer.step();
    reference.zero_grad();
    sharded_optimizer.step();
    sharded.zero_grad();
  }
  check_same_state(reference, sharded, 1e-5);
}

namespace {

constexpr std::int64_t wide = 256;
constexpr int wide_units = 16;

// The most the heap held above its level at the step's start, sampled before each unit's backward
// and after each backward, over one optimizer step of `micro_batches` (all but the last under
// no_sync()), and the micro-batches' losses. The shards' gradients are zeroed, not freed, so that the
// level at the start holds them: what a step holds beyond is what its backwards hold in passing.
template <class Job>
std::pair<std::int64_t, std::vector<double>> step_peak(Job& job, int micro_batches, int step) {
  job.zero_grad(/*set_to_none=*/false);
  const std::int64_t start = heap_in_use();
  std::int64_t peak = 0;
  const auto sample = [&] { peak = std::max(peak, heap_in_use() - start); };
  job.module().in_backward = [&](int) { sample(); };
  std::vector<double> losses;
  for (int micro = 0; micro < micro_batches; ++micro) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<std::uint64_t>(50 * step + micro + world().rank()));
    const at::Tensor loss = job.forward(torch::randn({2, wide}, gen)).square().mean() / micro_batches;
    losses.push_back(loss.item<double>());
    if (micro + 1 < micro_batches) {
      auto accumulate = job.no_sync();
      job.backward(loss);
    } else {
      job.backward(loss);
    }
    sample();
  }
  job.module().in_backward = nullptr;
  return {peak, losses};
}

}  // namespace

TEST_CASE("accumulating under fsdp() keeps the gradients sharded; accumulate_unsharded keeps the whole model's",
          "[fsdp][no_sync][memory]") {
  constexpr auto base = loom::model<hooked_units>(wide, wide_units) | loom::seeded(21);
  auto sharded = loom::build(base | loom::fsdp(), world());
  auto unsharded = loom::build(base | loom::fsdp({.accumulate_unsharded = true}), world());
  torch::optim::SGD sharded_optimizer(sharded.trainable_parameters(), 0.1);
  torch::optim::SGD unsharded_optimizer(unsharded.trainable_parameters(), 0.1);
  const std::int64_t unit_bytes = (wide * wide + wide) * 4;
  const std::int64_t whole_gradients = (wide_units + 2) * unit_bytes;
  (void)step_peak(sharded, 4, 0);  // the gradients, the allocator's and the process group's first touches
  (void)step_peak(unsharded, 4, 0);
  // A backward's transients depend on how far the process group lags: the most of a few steps.
  std::int64_t one_micro_batch = 0;
  for (int step = 0; step < 3; ++step) one_micro_batch = std::max(one_micro_batch, step_peak(sharded, 1, step).first);
  for (int step = 1; step <= 2; ++step) {
    const auto [sharded_peak, sharded_losses] = step_peak(sharded, 4, step);
    sharded_optimizer.step();
    const auto [unsharded_peak, unsharded_losses] = step_peak(unsharded, 4, step);
    unsharded_optimizer.step();
    INFO("one micro-batch " << one_micro_batch << " B, four: " << sharded_peak << " B sharded, " << unsharded_peak
                            << " B unsharded; a unit's gradients " << unit_bytes << " B, the model's "
                            << whole_gradients << " B");
    // Four micro-batches hold what one does, give or take the reductions in flight as the sample is
    // taken (a unit's packed gradients and its reduced rows: up to 2 units' gradients measured at 2
    // and 3 ranks on a loaded machine); before loom kept sharded gradients, a whole model's more.
    CHECK(sharded_peak <= one_micro_batch + 3 * unit_bytes);
    // Accumulating unsharded holds every unit's whole gradients until the last micro-batch.
    // (Measured: 3.3 to 4.5 MB of the 4.7 MB more, its transients overlapping one micro-batch's, whose
    // largest of 3 steps can be a lagging process group's; half of them, 9 units, is still 3 times
    // what the sharded accumulation above may hold.)
    CHECK(unsharded_peak >= one_micro_batch + whole_gradients / 2);
    // The same losses and the same state, to fp32's rounding of sums in another order.
    for (std::size_t micro = 0; micro < sharded_losses.size(); ++micro) {
      CHECK(std::abs(sharded_losses[micro] - unsharded_losses[micro]) <= 1e-6 * std::abs(unsharded_losses[micro]));
    }
  }
  check_same_state(unsharded, sharded, 1e-6);
}

TEST_CASE("under random delays in backward, every rank and every run issue the same collectives in the same order",
          "[fsdp][order]") {
  constexpr std::int64_t width = 6;
  constexpr auto base = loom::model<hooked_units>(width, 3) | loom::seeded(22);
  const auto check_order = [&](const auto& plan, const std::string& name) {
    CAPTURE(name);
    const std::pair<at::Tensor, std::int64_t> order = loom::testing::check_order_under_delays(plan, width);
    const at::Tensor& issued = order.first;
    const std::int64_t entries = order.second;
    // The passes that synchronise (every second one) issue every entry of the schedule, in order.
    const at::Tensor sync_pass = at::cat({at::arange(entries, at::kLong), at::full({1}, -1, at::kLong)});
    std::int64_t pass_start = 0;
    for (int pass = 0; pass < 6; ++pass) {
      const std::int64_t pass_end =
          pass_start +
          (issued.narrow(0, pass_start, issued.numel() - pass_start) == -1).nonzero()[0].item<std::int64_t>() + 1;
      if (pass % 2 == 1) CHECK(at::equal(issued.narrow(0, pass_start, pass_end - pass_start), sync_pass));
      pass_start = pass_end;
    }
  };
  check_order(base | loom::fsdp(), "fsdp");
  check_order(base | loom::fsdp({.reshard_after_forward = false}), "fsdp, not resharded");
  check_order(base | loom::lora(2, {"fc"}) | loom::trainable({"out"}) | loom::fsdp(), "lora | fsdp");
}

TEST_CASE("fsdp clip_grad_norm is the global norm, as local()'s", "[fsdp][clip]") {
  const double p = GENERATE(2.0, 1.0, 3.0, std::numeric_limits<double>::infinity());
  CAPTURE(p);
  auto reference = loom::build(loom::model<odd_units>() | loom::seeded(9) | loom::local(), world());
  auto sharded = loom::build(loom::model<odd_units>() | loom::seeded(9) | loom::fsdp(), world());
  const batch b = data(0);
  reference.backward(loss_on(reference, b, true));
  sharded.backward(loss_on(sharded, b, false));
  const double expected = reference.clip_grad_norm(0.01, p).item<double>();
  const double actual = sharded.clip_grad_norm(0.01, p).item<double>();
  CHECK(std::abs(actual - expected) <= 1e-6 * expected);
  // Both clipped to the same norm: the clipped gradients' norm is max_norm on each.
  CHECK(std::abs(reference.clip_grad_norm(1e9, p).item<double>() - 0.01) <= 1e-6);
  CHECK(std::abs(sharded.clip_grad_norm(1e9, p).item<double>() - 0.01) <= 1e-6);
}

TEST_CASE("fsdp state_dict is whole and the same on every rank; load_state_dict reshards it", "[fsdp][state]") {
  auto source = loom::build(loom::model<odd_units>() | loom::seeded(10) | loom::local(), world());
  auto sharded = loom::build(loom::model<odd_units>() | loom::seeded(11) | loom::fsdp(), world());
  sharded.load_state_dict(source.state_dict());
  check_same_state(source, sharded, 0);
  const batch b = data(1);
  CHECK(torch::allclose(sharded.forward(b.x), source.forward(b.x), 0, 1e-6));
}

TEST_CASE("merge and unmerge under fsdp fold the adapters into every rank's rows", "[fsdp][lora]") {
  constexpr auto adapters = loom::seeded(12) | loom::lora(2, {"up"});
  auto reference = loom::build(loom::model<odd_units>() | adapters | loom::local(), world());
  auto sharded = loom::build(loom::model<odd_units>() | adapters | loom::fsdp(), world());
  train_side_by_side(reference, sharded, /*reference_whole=*/true);  // B moves away from zero
  const batch b = data(2);
  const at::Tensor before = sharded.forward(b.x).detach();
  sharded.merge();
  reference.merge();
  check_same_state(reference, sharded, 1e-5);
  CHECK(torch::allclose(sharded.forward(b.x), before, 1e-5, 1e-6));
  sharded.unmerge();
  CHECK(torch::allclose(sharded.forward(b.x), before, 1e-5, 1e-6));
}

TEST_CASE("fsdp holds about 1/N of the parameters, gradients and optimizer state", "[fsdp][memory]") {
  auto reference = loom::build(loom::model<odd_units>() | loom::seeded(13) | loom::local(), world());
  auto sharded = loom::build(loom::model<odd_units>() | loom::seeded(13) | loom::fsdp(), world());
  torch::optim::AdamW reference_optimizer(reference.trainable_parameters(), torch::optim::AdamWOptions(1e-2));
  torch::optim::AdamW sharded_optimizer(sharded.trainable_parameters(), torch::optim::AdamWOptions(1e-2));
  const batch b = data(0);
  reference.backward(loss_on(reference, b, true));
  reference_optimizer.step();
  sharded.backward(loss_on(sharded, b, false));
  sharded_optimizer.step();
  const std::int64_t whole = training_state_bytes(reference, reference_optimizer);
  const std::int64_t mine = training_state_bytes(sharded, sharded_optimizer);
  // Padding: at most one row (at most 7 floats) per parameter beyond an even split, in each of the
  // parameter, its gradient and AdamW's two moments.
  const auto parameters = static_cast<std::int64_t>(reference.module().parameters().size());
  CAPTURE(whole, mine);
  CHECK(mine <= whole / world().world_size() + 4 * 4 * 7 * parameters);
  CHECK(mine < whole);
  CHECK(sharded.describe().find("fsdp: 3 units and the root over") != std::string::npos);
}

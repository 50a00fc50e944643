// Hybrid sharding, fsdp({.shard_group_size = S}), across real processes at 4 ranks (2 × 2) and 6
// (2 × 3 and 3 × 2), every shard group size that divides the world below it (1 included: every rank
// a replica of its own shards): parity with local() and fsdp(), with and without LoRA, both model
// forms, a rank that skips an adapted layer or a unit's output, no_sync, clipping; state per rank
// about 1/S; the schedule's groups; checkpoints resumed under another group size and under plain
// fsdp(); ranks that ask for different group sizes.
#include "delayed_order.hpp"
#include "odd_units.hpp"
#include "same_state.hpp"
#include "training_state.hpp"
#include "world.hpp"

#include <loom/loom.hpp>
#include <loom/runtime/agreement.hpp>

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/generators/catch_generators_range.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

using loom::testing::check_same_state;
using loom::testing::odd_units;
using loom::testing::shared_scratch;
using loom::testing::training_state_bytes;
using loom::testing::world;

namespace {

namespace fs = std::filesystem;

struct OddUnitsImpl : odd_units {};
TORCH_MODULE(OddUnits);  // the holder form; odd_units itself is the subclass form

constexpr std::int64_t rows_per_rank = 2;

std::int64_t all_rows() { return rows_per_rank * world().world_size(); }
at::Tensor my_rows(const at::Tensor& full) { return full.narrow(0, world().rank() * rows_per_rank, rows_per_rank); }

struct batch {
  at::Tensor x, y;
};

batch data(int step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(700 + step);
  return {torch::randn({all_rows(), 5}, gen), torch::randn({all_rows(), 3}, gen)};
}

// The shard group sizes below the world size that divide it: 1 and 2 at 4 ranks; 1, 2 and 3 at 6.
std::vector<std::int64_t> group_sizes() {
  std::vector<std::int64_t> sizes;
  for (int size = 1; size < world().world_size(); ++size) {
    if (world().world_size() % size == 0) sizes.push_back(size);
  }
  return sizes;
}

loom::fsdp_options hybrid(std::int64_t size, bool reshard = true) {
  return {.reshard_after_forward = reshard, .shard_group_size = size};
}

// `steps` SGD steps (a wrong scale of the gradient shows, which AdamW would hide) of each from the
// same start: `reference` on the whole batch when `whole`, else on this rank's rows, as `other`.
template <class Reference, class Other, class Forward>
void train_side_by_side(Reference& reference, Other& other, bool whole, Forward forward, int steps = 4) {
  torch::optim::SGD reference_optimizer(reference.trainable_parameters(), 0.1);
  torch::optim::SGD other_optimizer(other.trainable_parameters(), 0.1);
  for (int step = 0; step < steps; ++step) {
    const batch b = data(step);
    reference.backward(whole ? torch::mse_loss(forward(reference, b.x, step), b.y)
                             : torch::mse_loss(forward(reference, my_rows(b.x), step), my_rows(b.y)));
    reference_optimizer.step();
    reference.zero_grad();
    other.backward(torch::mse_loss(forward(other, my_rows(b.x), step), my_rows(b.y)));
    other_optimizer.step();
    other.zero_grad();
  }
}

const auto plain_forward = [](auto& job, const at::Tensor& x, int) { return job.forward(x); };

}  // namespace

TEST_CASE("hybrid sharding: N ranks on 1/N of the batch each equal one process on the whole batch", "[hsdp][parity]") {
  const std::int64_t size = GENERATE_COPY(from_range(group_sizes()));
  const bool reshard = GENERATE(true, false);
  CAPTURE(size, reshard);
  SECTION("a Module subclass") {
    auto reference = loom::build(loom::model<odd_units>() | loom::seeded(5) | loom::local(), world());
    auto hybrid_job =
        loom::build(loom::model<odd_units>() | loom::seeded(5) | loom::fsdp(hybrid(size, reshard)), world());
    train_side_by_side(reference, hybrid_job, /*whole=*/true, plain_forward);
    check_same_state(reference, hybrid_job, 1e-5);
  }
  SECTION("a TORCH_MODULE holder") {
    auto reference = loom::build(loom::model<OddUnits>() | loom::seeded(5) | loom::local(), world());
    auto hybrid_job =
        loom::build(loom::model<OddUnits>() | loom::seeded(5) | loom::fsdp(hybrid(size, reshard)), world());
    train_side_by_side(reference, hybrid_job, /*whole=*/true, plain_forward);
    check_same_state(reference, hybrid_job, 1e-5);
  }
}

TEST_CASE("hybrid sharding equals fsdp() over every rank on the same rows, with AdamW", "[hsdp][parity]") {
  const std::int64_t size = GENERATE_COPY(from_range(group_sizes()));
  CAPTURE(size);
  auto sharded = loom::build(loom::model<odd_units>() | loom::seeded(6) | loom::fsdp(), world());
  auto hybrid_job = loom::build(loom::model<odd_units>() | loom::seeded(6) | loom::fsdp(hybrid(size)), world());
  torch::optim::AdamW sharded_optimizer(sharded.trainable_parameters(), torch::optim::AdamWOptions(1e-2));
  torch::optim::AdamW hybrid_optimizer(hybrid_job.trainable_parameters(), torch::optim::AdamWOptions(1e-2));
  for (int step = 0; step < 4; ++step) {
    const batch b = data(step);
    sharded.backward(torch::mse_loss(sharded.forward(my_rows(b.x)), my_rows(b.y)));
    sharded_optimizer.step();
    sharded.zero_grad();
    hybrid_job.backward(torch::mse_loss(hybrid_job.forward(my_rows(b.x)), my_rows(b.y)));
    hybrid_optimizer.step();
    hybrid_job.zero_grad();
  }
  check_same_state(sharded, hybrid_job, 1e-5);
}

TEST_CASE("lora | hybrid sharding equals lora | local: adapters averaged over every rank", "[hsdp][lora]") {
  const std::int64_t size = GENERATE_COPY(from_range(group_sizes()));
  CAPTURE(size);
  constexpr auto adapters = loom::seeded(7) | loom::lora(2, {"up", "out"});
  auto reference = loom::build(loom::model<odd_units>() | adapters | loom::local(), world());
  auto hybrid_job = loom::build(loom::model<odd_units>() | adapters | loom::fsdp(hybrid(size)), world());
  train_side_by_side(reference, hybrid_job, /*whole=*/true, plain_forward);
  check_same_state(reference, hybrid_job, 1e-5);
}

TEST_CASE("lora with trainable base layers under hybrid sharding: shards and adapters both reduced", "[hsdp][lora]") {
  const std::int64_t size = GENERATE_COPY(from_range(group_sizes()));
  CAPTURE(size);
  constexpr auto plan = loom::seeded(8) | loom::lora(2, {"up"}) | loom::trainable({"out", "blocks.1.down"});
  auto reference = loom::build(loom::model<odd_units>() | plan | loom::local(), world());
  auto hybrid_job = loom::build(loom::model<odd_units>() | plan | loom::fsdp(hybrid(size)), world());
  train_side_by_side(reference, hybrid_job, /*whole=*/true, plain_forward);
  check_same_state(reference, hybrid_job, 1e-5);
}

TEST_CASE("a rank that skips an adapted layer or a unit's output: no hang, the same as ddp", "[hsdp][unused]") {
  // The last rank leaves out, in step 2, the last unit's `up` (and its adapter); the first rank, in
  // step 1, the last unit's output altogether, so that its backward never reaches that unit.
  struct skipping : odd_units {
    at::Tensor forward(const at::Tensor& x, int step) {
      const int rank = world().rank();
      const bool skip_up = rank == world().world_size() - 1 && step == 2;
      const bool exit_early = rank == 0 && step == 1;
      at::Tensor h = in(x);
      at::Tensor before_last;
      for (std::size_t i = 0; i < blocks->size(); ++i) {
        const bool last = i + 1 == blocks->size();
        if (last) before_last = h;
        h = blocks[i]->as<Block>()->forward(h, !(skip_up && last));
      }
      return out(exit_early ? before_last : h);
    }
  };
  const std::int64_t size = GENERATE_COPY(from_range(group_sizes()));
  const bool with_lora = GENERATE(false, true);
  CAPTURE(size, with_lora);
  const auto forward = [](auto& job, const at::Tensor& x, int step) { return job.forward(x, step); };
  if (with_lora) {
    constexpr auto adapters = loom::seeded(9) | loom::lora(2, {"up"});
    auto replicated =
        loom::build(loom::model<skipping>() | adapters | loom::ddp({.find_unused_parameters = true}), world());
    auto hybrid_job = loom::build(loom::model<skipping>() | adapters | loom::fsdp(hybrid(size)), world());
    train_side_by_side(replicated, hybrid_job, /*whole=*/false, forward);
    check_same_state(replicated, hybrid_job, 1e-5);
  } else {
    auto replicated =
        loom::build(loom::model<skipping>() | loom::seeded(9) | loom::ddp({.find_unused_parameters = true}), world());
    auto hybrid_job = loom::build(loom::model<skipping>() | loom::seeded(9) | loom::fsdp(hybrid(size)), world());
    train_side_by_side(replicated, hybrid_job, /*whole=*/false, forward);
    check_same_state(replicated, hybrid_job, 1e-5);
  }
}

TEST_CASE(
    "hybrid sharding no_sync: micro-batches reduce-scatter, the replicas all-reduce once a step, and equal local()",
    "[hsdp][no_sync]") {
  const std::int64_t size = GENERATE_COPY(from_range(group_sizes()));
  const bool unsharded = GENERATE(false, true);
  CAPTURE(size, unsharded);
  auto reference = loom::build(loom::model<odd_units>() | loom::seeded(15) | loom::local(), world());
  loom::fsdp_options options = hybrid(size);
  options.accumulate_unsharded = unsharded;
  auto hybrid_job = loom::build(loom::model<odd_units>() | loom::seeded(15) | loom::fsdp(options), world());
  torch::optim::SGD reference_optimizer(reference.trainable_parameters(), 0.1);
  torch::optim::SGD hybrid_optimizer(hybrid_job.trainable_parameters(), 0.1);
  const auto entries = hybrid_job.schedule().entries();
  // How many of the pass's collectives were reduce-scatters, and how many the replicas' all-reduces.
  const auto issued_reductions = [&] {
    std::pair<int, int> counts{0, 0};
    for (const std::size_t index : hybrid_job.strategy().issued_entries()) {
      REQUIRE(index < entries.size());
      const loom::schedule_entry& entry = entries[index];
      if (entry.op == loom::collective_op::reduce_scatter) ++counts.first;
      if (entry.op == loom::collective_op::all_reduce && entry.group.starts_with("replicate")) ++counts.second;
    }
    return counts;
  };
  int scheduled_reduce_scatters = 0, scheduled_replica_reductions = 0;
  for (const loom::schedule_entry& entry : entries) {
    if (entry.op == loom::collective_op::reduce_scatter) ++scheduled_reduce_scatters;
    if (entry.op == loom::collective_op::all_reduce && entry.group.starts_with("replicate")) {
      ++scheduled_replica_reductions;
    }
  }
  REQUIRE(scheduled_replica_reductions > 0);
  for (int step = 0; step < 2; ++step) {
    int replica_reductions = 0;
    for (int micro = 0; micro < 3; ++micro) {
      const batch b = data(10 * step + micro);
      reference.backward(torch::mse_loss(reference.forward(b.x), b.y));
      const auto loss = [&] { return torch::mse_loss(hybrid_job.forward(my_rows(b.x)), my_rows(b.y)); };
      if (micro < 2) {
        auto accumulate = hybrid_job.no_sync();
        hybrid_job.backward(loss());
        // Reduce-scattered in the shard group (unless accumulated unsharded), and kept apart until
        // the replicas' all-reduce: the shards have no gradient yet.
        CHECK(issued_reductions().first == (unsharded ? 0 : scheduled_reduce_scatters));
        for (const at::Tensor& shard : hybrid_job.trainable_parameters()) CHECK_FALSE(shard.grad().defined());
      } else {
        hybrid_job.backward(loss());
        CHECK(issued_reductions().first == scheduled_reduce_scatters);
      }
      replica_reductions += issued_reductions().second;
    }
    // Once per optimizer step.
    CHECK(replica_reductions == scheduled_replica_reductions);
    reference_optimizer.step();
    reference.zero_grad();
    hybrid_optimizer.step();
    hybrid_job.zero_grad();
  }
  check_same_state(reference, hybrid_job, 1e-5);
}

TEST_CASE("hybrid sharding under random delays in backward: every rank and every run issue the same collectives",
          "[hsdp][order]") {
  const std::int64_t size = GENERATE_COPY(from_range(group_sizes()));
  CAPTURE(size);
  constexpr std::int64_t width = 6;
  constexpr auto base = loom::model<loom::testing::hooked_units>(width, 3) | loom::seeded(23);
  const auto check_order = [&](const auto& plan, const std::string& name) {
    CAPTURE(name);
    (void)loom::testing::check_order_under_delays(plan, width);
  };
  check_order(base | loom::fsdp(hybrid(size)), "hybrid");
  check_order(base | loom::lora(2, {"fc"}) | loom::trainable({"out"}) | loom::fsdp(hybrid(size, false)),
              "lora | hybrid, not resharded");
}

TEST_CASE("hybrid sharding's clip_grad_norm counts each shard once", "[hsdp][clip]") {
  const std::int64_t size = GENERATE_COPY(from_range(group_sizes()));
  const double p = GENERATE(2.0, std::numeric_limits<double>::infinity());
  CAPTURE(size, p);
  auto hybrid_job = loom::build(loom::model<odd_units>() | loom::seeded(16) | loom::lora(2, {"up"}) |
                                    loom::trainable({"out"}) | loom::fsdp(hybrid(size)),
                                world());
  auto with_out = loom::build(
      loom::model<odd_units>() | loom::seeded(16) | loom::lora(2, {"up"}) | loom::trainable({"out"}) | loom::local(),
      world());
  const batch b = data(0);
  with_out.backward(torch::mse_loss(with_out.forward(b.x), b.y));
  hybrid_job.backward(torch::mse_loss(hybrid_job.forward(my_rows(b.x)), my_rows(b.y)));
  const double expected = with_out.clip_grad_norm(0.01, p).item<double>();
  const double actual = hybrid_job.clip_grad_norm(0.01, p).item<double>();
  CHECK(std::abs(actual - expected) <= 1e-6 * expected);
}

TEST_CASE("hybrid sharding holds about 1/S of the parameters, gradients and optimizer state", "[hsdp][memory]") {
  const std::int64_t size = GENERATE_COPY(from_range(group_sizes()));
  CAPTURE(size);
  auto reference = loom::build(loom::model<odd_units>() | loom::seeded(13) | loom::local(), world());
  auto hybrid_job = loom::build(loom::model<odd_units>() | loom::seeded(13) | loom::fsdp(hybrid(size)), world());
  torch::optim::AdamW reference_optimizer(reference.trainable_parameters(), torch::optim::AdamWOptions(1e-2));
  torch::optim::AdamW hybrid_optimizer(hybrid_job.trainable_parameters(), torch::optim::AdamWOptions(1e-2));
  const batch b = data(0);
  reference.backward(torch::mse_loss(reference.forward(b.x), b.y));
  reference_optimizer.step();
  hybrid_job.backward(torch::mse_loss(hybrid_job.forward(my_rows(b.x)), my_rows(b.y)));
  hybrid_optimizer.step();
  const std::int64_t whole = training_state_bytes(reference, reference_optimizer);
  const std::int64_t mine = training_state_bytes(hybrid_job, hybrid_optimizer);
  const auto parameters = static_cast<std::int64_t>(reference.module().parameters().size());
  CAPTURE(whole, mine);
  // Padding: at most one row (7 floats) per parameter beyond an even split, in each of the
  // parameter, its gradient and AdamW's two moments.
  CHECK(mine <= whole / size + 4 * 4 * 7 * parameters);
  if (size > 1) CHECK(mine < whole);
  CHECK(mine > whole / world().world_size());  // its group's share, not 1/N of the model
  CHECK(hybrid_job.shard_group_size() == size);
}

TEST_CASE("the schedule names each collective's group, the same on every rank", "[hsdp][schedule]") {
  const std::int64_t size = GENERATE_COPY(from_range(group_sizes()));
  CAPTURE(size);
  const int replicas = world().world_size() / static_cast<int>(size);
  auto hybrid_job = loom::build(loom::model<odd_units>() | loom::seeded(17) | loom::lora(2, {"up"}) |
                                    loom::trainable({"out", "in"}) | loom::fsdp(hybrid(size)),
                                world());
  const std::string shard = "shard[" + std::to_string(size) + "]";
  const std::string replicate = "replicate[" + std::to_string(replicas) + "]";
  const auto entries = hybrid_job.schedule().entries();
  std::size_t gathers = 0, reduce_scatters = 0, replica_reductions = 0, adapter_reductions = 0;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const loom::schedule_entry& entry = entries[i];
    CAPTURE(entry.to_string());
    switch (entry.op) {
      case loom::collective_op::all_gather:
        CHECK(entry.group == shard);
        ++gathers;
        break;
      case loom::collective_op::reduce_scatter:
        CHECK(entry.group == shard);
        ++reduce_scatters;
        // Its all-reduce across the replicas follows it, of the same tensors.
        REQUIRE(i + 1 < entries.size());
        CHECK(entries[i + 1].group == replicate);
        CHECK(entries[i + 1].op == loom::collective_op::all_reduce);
        CHECK(entries[i + 1].bytes() == entry.bytes());
        break;
      case loom::collective_op::all_reduce:
        if (entry.group == replicate) {
          ++replica_reductions;
        } else {
          CHECK(entry.group == "world");  // the replicated adapters, averaged over every rank
          ++adapter_reductions;
        }
        break;
      default: FAIL("an unexpected collective");
    }
  }
  CHECK(gathers >= 4);          // the root and three units, forward (and backward when resharded)
  CHECK(reduce_scatters == 1);  // the root's trainable `in` and `out`; the units' bases are frozen
  CHECK(replica_reductions == reduce_scatters);
  CHECK(adapter_reductions >= 1);
  CHECK_THAT(hybrid_job.describe(),
             Catch::Matchers::ContainsSubstring("fsdp: hybrid sharding: " + std::to_string(replicas) +
                                                " shard groups of " + std::to_string(size) + " rank"));
  // Plain fsdp() names the world, as before: no group of its own, no replicas' all-reduce.
  auto sharded = loom::build(loom::model<odd_units>() | loom::seeded(17) | loom::fsdp(), world());
  for (const loom::schedule_entry& entry : sharded.schedule().entries()) CHECK(entry.group == "world");
  CHECK(sharded.shard_group_size() == world().world_size());
  CHECK(sharded.schedule().fingerprint() != hybrid_job.schedule().fingerprint());
}

TEST_CASE("a checkpoint saved under hybrid sharding resumes under another group size and under fsdp()",
          "[hsdp][checkpoint]") {
  const std::vector<std::int64_t> sizes = group_sizes();
  const std::int64_t saved_size = GENERATE_COPY(from_range(group_sizes()));
  CAPTURE(saved_size);
  const fs::path folder = shared_scratch("hsdp", "resume-" + std::to_string(saved_size));
  constexpr auto plan = loom::model<odd_units>() | loom::seeded(18) | loom::lora(2, {"up"}) | loom::trainable({"out"});
  auto saved = loom::build(plan | loom::fsdp(hybrid(saved_size)), world());
  torch::optim::AdamW saved_optimizer(saved.trainable_parameters(), torch::optim::AdamWOptions(1e-2));
  for (int step = 0; step < 2; ++step) {  // the moments, and lora_B, away from zero
    const batch b = data(20 + step);
    saved.backward(torch::mse_loss(saved.forward(my_rows(b.x)), my_rows(b.y)));
    saved_optimizer.step();
    saved.zero_grad();
  }
  loom::checkpointer(world(), {.folder = folder}).save(saved, saved_optimizer, 2);
  // One more step from there, in the saved layout: what every resumed layout must also reach.
  const batch next = data(30);
  const auto step_once = [&](auto& job, torch::optim::Optimizer& optimizer) {
    job.backward(torch::mse_loss(job.forward(my_rows(next.x)), my_rows(next.y)));
    optimizer.step();
    job.zero_grad();
  };
  const loom::tensor_state at_save = saved.state_dict();
  step_once(saved, saved_optimizer);
  // Every other layout at this world size: each other group size, and every rank (fsdp()).
  std::vector<std::int64_t> layouts = sizes;
  layouts.push_back(loom::fsdp_options::every_rank);
  for (const std::int64_t size : layouts) {
    CAPTURE(size);
    auto resumed = loom::build(plan | loom::fsdp(hybrid(size)), world());
    torch::optim::AdamW resumed_optimizer(resumed.trainable_parameters(), torch::optim::AdamWOptions(1e-2));
    const auto point = loom::checkpointer(world(), {.folder = folder}).resume(resumed, resumed_optimizer);
    REQUIRE(point);
    CHECK(point->step == 2);
    const loom::tensor_state loaded = resumed.state_dict();
    REQUIRE(loaded.size() == at_save.size());
    for (std::size_t i = 0; i < loaded.size(); ++i) {
      CAPTURE(loaded[i].name);
      CHECK(loaded[i].name == at_save[i].name);
      CHECK(at::equal(loaded[i].tensor, at_save[i].tensor));
    }
    // The moments came along, their rows moved between ranks: the next step is the saved layout's.
    step_once(resumed, resumed_optimizer);
    check_same_state(saved, resumed, 1e-6);
  }
  // The manifest records the layout.
  const loom::checkpoint_manifest manifest = loom::read_checkpoint_manifest(folder / "step-00000002");
  CHECK(manifest.shard_group_size == saved_size);
  CHECK(manifest.world_size == world().world_size());
}

TEST_CASE("per_node: the shard group is LOCAL_WORLD_SIZE's ranks", "[hsdp]") {
  auto per_node = loom::build(
      loom::model<odd_units>() | loom::seeded(20) | loom::fsdp(hybrid(loom::fsdp_options::per_node)), world());
  CHECK(per_node.shard_group_size() == world().env().local_world_size);
}

TEST_CASE("ranks that ask for different shard group sizes fail together within seconds, naming both",
          "[hsdp][errors]") {
  // Rank 0 asks for groups of 2, the others for every rank.
  const std::int64_t asked = world().rank() == 0 ? 2 : loom::fsdp_options::every_rank;
  const auto started = std::chrono::steady_clock::now();
  try {
    (void)loom::build(loom::model<odd_units>() | loom::seeded(19) | loom::fsdp(hybrid(asked)), world());
    FAIL("built with different shard group sizes");
  } catch (const loom::rank_mismatch& error) {
    const std::string text = error.what();
    CHECK_THAT(text, Catch::Matchers::ContainsSubstring("shard groups of 2 ranks"));
    CHECK_THAT(
        text, Catch::Matchers::ContainsSubstring("shard groups of " + std::to_string(world().world_size()) + " ranks"));
  }
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(10));
  // A size that does not divide the world: one sentence on every rank.
  CHECK_THROWS_WITH(
      loom::build(loom::model<odd_units>() | loom::seeded(19) | loom::fsdp(hybrid(world().world_size() - 1)), world()),
      Catch::Matchers::ContainsSubstring("does not divide the world size " + std::to_string(world().world_size())));
  CHECK_THROWS_WITH(loom::build(loom::model<odd_units>() | loom::seeded(19) | loom::fsdp(hybrid(-3)), world()),
                    Catch::Matchers::ContainsSubstring("a shard group of -3 ranks cannot divide"));
}

// ddp() across real processes: parity with one process on the whole batch, seeded replicas,
// accumulation with no_sync(), unused parameters with find_unused_parameters.
#include "branchy.hpp"
#include "world.hpp"

#include <loom/loom.hpp>
#include <models/mlp.hpp>
#include <models/tiny_gpt.hpp>
#include <strategies/average_every_step.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

using loom::testing::branchy;
using loom::testing::same_on_every_rank;
using loom::testing::world;

namespace {

constexpr std::int64_t rows_per_rank = 4;
constexpr models::tiny_gpt_config small{.vocab = 32, .d = 16, .layers = 2, .heads = 2, .ctx = 8};

std::int64_t all_rows() { return rows_per_rank * world().world_size(); }

// This rank's share of a batch that every rank draws identically.
at::Tensor my_rows(const at::Tensor& full) { return full.narrow(0, world().rank() * rows_per_rank, rows_per_rank); }

struct batch {
  at::Tensor x, y;
};

batch regression_batch(int step, std::int64_t width) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + step);
  return {torch::randn({all_rows(), width}, gen), torch::randn({all_rows(), width}, gen)};
}

batch token_batch(int step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(200 + step);
  return {torch::randint(0, small.vocab, {all_rows(), small.ctx}, gen),
          torch::randint(0, small.vocab, {all_rows(), small.ctx}, gen)};
}

template <class A, class B>
void check_same_parameters(A& a, B& b) {
  auto pa = a.module().named_parameters();
  auto pb = b.module().named_parameters();
  for (const auto& name : pa.keys()) {
    CAPTURE(name);
    CHECK(torch::allclose(pa[name], pb[name], 0, 1e-5));
  }
}

// Five SGD steps of `reference` (one process's view: the whole batch, local()) and of `distributed`
// (this rank's rows, ddp()), from the same seeded start.
template <class Reference, class Distributed, class Loss>
void train_side_by_side(Reference& reference, Distributed& distributed, Loss loss_of) {
  torch::optim::SGD reference_optimizer(reference.trainable_parameters(), 0.1);
  torch::optim::SGD distributed_optimizer(distributed.trainable_parameters(), 0.1);
  for (int step = 0; step < 5; ++step) {
    auto full_loss = loss_of(reference, step, /*whole=*/true);
    reference.backward(full_loss);
    reference_optimizer.step();
    reference.zero_grad();
    auto my_loss = loss_of(distributed, step, /*whole=*/false);
    distributed.backward(my_loss);
    distributed_optimizer.step();
    distributed.zero_grad();
  }
}

template <class Linear>
void check_lora_parity() {
  using M = models::BasicTinyGpt<Linear>;
  constexpr auto adapters = loom::seeded(31) | loom::lora(4, {"q_proj", "v_proj", "head"});
  auto reference = loom::build(loom::model<M>(small) | adapters | loom::local(), world());
  auto distributed = loom::build(loom::model<M>(small) | adapters | loom::ddp(), world());
  train_side_by_side(reference, distributed, [](auto& job, int step, bool whole) {
    auto [x, y] = token_batch(step);
    return whole ? job.forward(x, y) : job.forward(my_rows(x), my_rows(y));
  });
  check_same_parameters(reference, distributed);
}

at::Tensor flat_parameters(torch::nn::Module& module) {
  std::vector<at::Tensor> flat;
  for (auto& p : module.parameters()) flat.push_back(p.detach().reshape(-1));
  return torch::cat(flat);
}

}  // namespace

TEST_CASE("ddp: N ranks with 1/N of the batch each equal one process on the whole batch", "[ddp][parity]") {
  using M = models::BasicMlp<loom::nn::Linear>;
  auto options = GENERATE(loom::ddp_options{}, loom::ddp_options{.gradient_as_bucket_view = true},
                          loom::ddp_options{.static_graph = true}, loom::ddp_options{.find_unused_parameters = true});
  CAPTURE(loom::ddp(options).options());
  auto reference = loom::build(loom::model<M>(16, 3) | loom::seeded(21) | loom::local(), world());
  auto distributed = loom::build(loom::model<M>(16, 3) | loom::seeded(21) | loom::ddp(options), world());
  train_side_by_side(reference, distributed, [](auto& job, int step, bool whole) {
    auto [x, y] = regression_batch(step, 16);
    return whole ? torch::mse_loss(job.forward(x), y) : torch::mse_loss(job.forward(my_rows(x)), my_rows(y));
  });
  check_same_parameters(reference, distributed);
}

TEST_CASE("ddp parity with LoRA on the loom::nn::Linear fast path", "[ddp][parity][lora]") {
  check_lora_parity<loom::nn::Linear>();
}

TEST_CASE("ddp parity with LoRA on the torch::nn::Linear fallback", "[ddp][parity][lora]") {
  check_lora_parity<torch::nn::Linear>();
}

TEST_CASE("seeded replicas are bit-identical on every rank, with no broadcast", "[seeded]") {
  auto job = loom::build(loom::model<models::TinyGpt>(small) | loom::seeded(5) | loom::lora(4) | loom::ddp(), world());
  CHECK(same_on_every_rank(flat_parameters(job.module())));
}

TEST_CASE("without seeded, rank 0's replica is broadcast", "[replicas]") {
  auto job = loom::build(loom::model<models::BasicMlp<loom::nn::Linear>>(8, 2) | loom::ddp(), world());
  CHECK(same_on_every_rank(flat_parameters(job.module())));
}

TEST_CASE("the ddp schedule is its buckets, in reverse registration order", "[ddp][schedule]") {
  auto job =
      loom::build(loom::model<models::BasicMlp<loom::nn::Linear>>(512, 3) | loom::seeded(1) | loom::ddp(), world());
  const auto entries = job.schedule().entries();
  REQUIRE(entries.size() == 2);  // a 1 MiB first bucket, then the rest under bucket_cap_mb = 25
  CHECK(entries[0].op == loom::collective_op::all_reduce);
  CHECK(entries[0].phase == loom::step_phase::backward);
  CHECK(entries[0].tensors.front().name == "layers.2.bias");
  CHECK(entries[1].tensors.back().name == "layers.0.weight");
  CHECK(job.schedule().bytes_per_step() == (3 * 512 * 512 + 3 * 512) * 4);
  CHECK(same_on_every_rank(at::full({1}, static_cast<std::int64_t>(job.schedule().fingerprint()))));
}

// Registers `second` before `first` and runs `first` first, so that backward produces second's
// gradients before first's: the reverse of what reverse registration order expects.
class UsedOutOfOrder : public torch::nn::Module {
 public:
  UsedOutOfOrder()
      : second(register_module("second", loom::nn::Linear(512, 512))),
        first(register_module("first", loom::nn::Linear(512, 512))) {}
  at::Tensor forward(const at::Tensor& x) { return second(torch::relu(first(x))); }

  loom::nn::Linear second;
  loom::nn::Linear first;
};

std::vector<std::string> bucket_names(const loom::collective_schedule& schedule) {
  std::vector<std::string> names;
  for (const loom::schedule_entry& entry : schedule.entries()) {
    if (entry.op != loom::collective_op::all_reduce) continue;
    std::string bucket;
    for (const loom::tensor_spec& t : entry.tensors) bucket += (bucket.empty() ? "" : " ") + t.name;
    names.push_back(bucket);
  }
  return names;
}

TEST_CASE("ddp rebuilds its buckets once, in the order the first step's gradients became ready", "[ddp][schedule]") {
  constexpr auto plan = loom::model<UsedOutOfOrder>() | loom::seeded(5);
  auto reference = loom::build(plan | loom::local(), world());
  auto distributed = loom::build(plan | loom::ddp(), world());
  const auto built = bucket_names(distributed.schedule());
  const std::uint64_t built_fingerprint = distributed.schedule().fingerprint();
  // Reverse registration order puts first's gradients in the first bucket.
  REQUIRE(built.size() >= 2);
  CHECK(built.front().rfind("first.", 0) == 0);

  torch::optim::SGD reference_optimizer(reference.trainable_parameters(), 0.1);
  torch::optim::SGD distributed_optimizer(distributed.trainable_parameters(), 0.1);
  std::vector<std::vector<std::string>> per_step;
  for (int step = 0; step < 4; ++step) {
    auto [x, y] = regression_batch(step, 512);
    reference.backward(torch::mse_loss(reference.forward(x), y));
    distributed.backward(torch::mse_loss(distributed.forward(my_rows(x)), my_rows(y)));
    per_step.push_back(bucket_names(distributed.schedule()));
    // The gradients are the whole batch's, before and after the rebuild.
    const auto expected = reference.trainable_parameters();
    const auto actual = distributed.trainable_parameters();
    for (std::size_t i = 0; i < actual.size(); ++i) {
      CAPTURE(step, i);
      CHECK(torch::allclose(actual[i].grad(), expected[i].grad(), 0, 1e-5));
    }
    reference_optimizer.step();
    distributed_optimizer.step();
    reference.zero_grad();
    distributed.zero_grad();
  }
  // Step 1 ran on the built buckets; the rebuild came before step 2's forward, and only then.
  CHECK(per_step[0] == built);
  CHECK(per_step[1].front().rfind("second.", 0) == 0);
  CHECK(per_step[1].back().find("first.") != std::string::npos);
  CHECK(per_step[2] == per_step[1]);
  CHECK(per_step[3] == per_step[1]);
  // The rebuilt schedule is every rank's, and checkpoints keep the one as built.
  CHECK(distributed.schedule().fingerprint() != built_fingerprint);
  CHECK(same_on_every_rank(at::full({1}, static_cast<std::int64_t>(distributed.schedule().fingerprint()))));
  CHECK(distributed.built_schedule_fingerprint() == built_fingerprint);
  CHECK(distributed.describe().find("ddp: rebuilt in the order the first synchronised step's gradients became ready") !=
        std::string::npos);
}

TEST_CASE("ddp with find_unused_parameters keeps its buckets as built, as DDP", "[ddp][schedule]") {
  auto job = loom::build(loom::model<UsedOutOfOrder>() | loom::seeded(5) | loom::ddp({.find_unused_parameters = true}),
                         world());
  const std::uint64_t built = job.schedule().fingerprint();
  for (int step = 0; step < 3; ++step) {
    auto [x, y] = regression_batch(step, 512);
    job.backward(torch::mse_loss(job.forward(my_rows(x)), my_rows(y)));
    job.zero_grad();
  }
  CHECK(job.schedule().fingerprint() == built);
}

TEST_CASE("no_sync(): accumulation steps stay local, the next step reduces the sum", "[ddp][no_sync]") {
  using M = models::BasicMlp<loom::nn::Linear>;
  auto reference = loom::build(loom::model<M>(16, 3) | loom::seeded(8) | loom::local(), world());
  auto distributed = loom::build(loom::model<M>(16, 3) | loom::seeded(8) | loom::ddp(), world());
  auto [x0, y0] = regression_batch(0, 16);
  auto [x1, y1] = regression_batch(1, 16);
  reference.backward(torch::mse_loss(reference.forward(x0), y0));
  reference.backward(torch::mse_loss(reference.forward(x1), y1));
  {
    auto accumulate = distributed.no_sync();
    distributed.backward(torch::mse_loss(distributed.forward(my_rows(x0)), my_rows(y0)));
  }
  CHECK_FALSE(same_on_every_rank(distributed.trainable_parameters().front().grad()));
  distributed.backward(torch::mse_loss(distributed.forward(my_rows(x1)), my_rows(y1)));
  auto expected = reference.trainable_parameters();
  auto actual = distributed.trainable_parameters();
  for (std::size_t i = 0; i < actual.size(); ++i) CHECK(torch::allclose(actual[i].grad(), expected[i].grad(), 0, 1e-5));
}

TEST_CASE("find_unused_parameters: a parameter unused on one rank counts as zero in the average", "[ddp][unused]") {
  const bool use_extra = world().rank() != world().world_size() - 1;
  auto local = loom::build(loom::model<branchy>() | loom::seeded(4) | loom::local(), world());
  auto distributed =
      loom::build(loom::model<branchy>() | loom::seeded(4) | loom::ddp({.find_unused_parameters = true}), world());
  auto [x, y] = regression_batch(0, 8);
  local.backward(torch::mse_loss(local.forward(my_rows(x), use_extra), my_rows(y)));
  distributed.backward(torch::mse_loss(distributed.forward(my_rows(x), use_extra), my_rows(y)));
  for (auto& [name, module] : {std::pair{"trunk", local.module().trunk}, std::pair{"extra", local.module().extra}}) {
    CAPTURE(name);
    at::Tensor grad =
        module->weight.grad().defined() ? module->weight.grad().clone() : torch::zeros_like(module->weight);
    world().comm().all_reduce(grad, loom::reduce_op::mean).wait();
    auto& mine = std::string(name) == "trunk" ? distributed.module().trunk : distributed.module().extra;
    REQUIRE(mine->weight.grad().defined());
    CHECK(torch::allclose(mine->weight.grad(), grad, 0, 1e-6));
  }
}

TEST_CASE("a user-written strategy runs: dsl_examples' average_every_step trains like ddp()", "[strategy]") {
  using M = models::BasicMlp<loom::nn::Linear>;
  auto reference = loom::build(loom::model<M>(16, 3) | loom::seeded(9) | loom::ddp(), world());
  auto custom =
      loom::build(loom::model<M>(16, 3) | loom::seeded(9) | loom::strategy(examples::average_every_step{}), world());
  CHECK(custom.schedule().entries().size() == 6);
  train_side_by_side(reference, custom, [](auto& job, int step, bool) {
    auto [x, y] = regression_batch(step, 16);
    return torch::mse_loss(job.forward(my_rows(x)), my_rows(y));
  });
  check_same_parameters(reference, custom);
}

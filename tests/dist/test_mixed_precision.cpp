// mixed_precision(...) and default_dtype(...) across real processes, at 1, 2 and 3 ranks: what each
// collective carries and what each rank holds (fsdp()'s gathers in bf16, half of fp32's bytes, over
// fp32 state; a bf16 base under LoRA in half the bytes), the forward's dtypes under autocast and
// under fsdp(), bf16 training against fp32's over 20 steps, no_sync accumulating in the reduce dtype
// with a parameter first used in the last micro-batch (PyTorch #160279), and the master weights kept
// through state_dict(), merge and unmerge.
#include "odd_units.hpp"
#include "world.hpp"

#include <loom/loom.hpp>
#include <models/tiny_gpt.hpp>

#include <torch/optim/adamw.h>
#include <torch/torch.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

using Catch::Matchers::ContainsSubstring;
using loom::testing::world;

namespace {

const models::tiny_gpt_config small{.vocab = 32, .d = 32, .layers = 2, .heads = 2, .ctx = 16};

// This rank's tokens and targets at `step`: another batch on every rank and at every step.
std::pair<at::Tensor, at::Tensor> tokens(int step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 * static_cast<std::uint64_t>(step) +
                                                      static_cast<std::uint64_t>(world().rank()));
  at::Tensor ids = torch::randint(0, small.vocab, {4, small.ctx}, gen);
  at::Tensor targets = torch::randint(0, small.vocab, {4, small.ctx}, gen);
  return {ids, targets};
}

std::int64_t bytes_of(const loom::collective_schedule& schedule, loom::collective_op op) {
  std::int64_t total = 0;
  for (const loom::schedule_entry& entry : schedule.entries()) {
    if (entry.op == op) total += entry.bytes();
  }
  return total;
}

bool carries_only(const loom::collective_schedule& schedule, loom::collective_op op, at::ScalarType type) {
  for (const loom::schedule_entry& entry : schedule.entries()) {
    if (entry.op != op) continue;
    for (const loom::tensor_spec& t : entry.tensors) {
      if (t.dtype != type) return false;
    }
  }
  return true;
}

// The bytes of live storage behind the named tensors that `keep` selects.
template <class Keep>
std::int64_t storage_bytes(const loom::tensor_state& state, Keep keep) {
  std::int64_t total = 0;
  for (const loom::named_tensor& t : state) {
    if (keep(t.name)) total += static_cast<std::int64_t>(t.tensor.storage().nbytes());
  }
  return total;
}

bool is_adapter(const std::string& name) { return loom::lora_adapter::is_adapter_parameter(name); }

constexpr auto fp32_plan = loom::model<models::TinyGpt>(small) | loom::seeded(1);

}  // namespace

TEST_CASE("under fsdp() the gathers carry bf16, half the bytes of fp32's, over the same fp32 state", "[fsdp]") {
  auto plain = loom::build(fp32_plan | loom::fsdp(), world());
  auto mixed = loom::build(fp32_plan | loom::mixed_precision() | loom::fsdp(), world());

  CHECK(2 * bytes_of(mixed.schedule(), loom::collective_op::all_gather) ==
        bytes_of(plain.schedule(), loom::collective_op::all_gather));
  CHECK(bytes_of(mixed.schedule(), loom::collective_op::reduce_scatter) ==
        bytes_of(plain.schedule(), loom::collective_op::reduce_scatter));
  CHECK(carries_only(mixed.schedule(), loom::collective_op::all_gather, at::kBFloat16));
  CHECK(carries_only(mixed.schedule(), loom::collective_op::reduce_scatter, at::kFloat));
  CHECK(mixed.schedule().fingerprint() != plain.schedule().fingerprint());  // the dtypes are in it
  CHECK_THAT(mixed.describe(), ContainsSubstring("mixed precision: the strategy casts the parameters to BFloat16"));

  // What each rank holds and steps: fp32 shards of the same sizes; the module's parameters are the
  // bf16 compute copies.
  const loom::tensor_state plain_local = plain.local_state_dict();
  const loom::tensor_state mixed_local = mixed.local_state_dict();
  REQUIRE(mixed_local.size() == plain_local.size());
  for (std::size_t i = 0; i < mixed_local.size(); ++i) {
    CAPTURE(mixed_local[i].name);
    CHECK(mixed_local[i].spec().to_string() == plain_local[i].spec().to_string());
  }
  for (const at::Tensor& p : mixed.trainable_parameters()) CHECK(p.scalar_type() == at::kFloat);
  for (const at::Tensor& p : mixed.module().parameters()) CHECK(p.scalar_type() == at::kBFloat16);

  // state_dict() gives the master weights: those the fp32 plan built, exactly.
  const loom::tensor_state plain_whole = plain.state_dict();
  const loom::tensor_state mixed_whole = mixed.state_dict();
  REQUIRE(mixed_whole.size() == plain_whole.size());
  for (std::size_t i = 0; i < mixed_whole.size(); ++i) {
    CAPTURE(mixed_whole[i].name);
    CHECK(torch::equal(mixed_whole[i].tensor, plain_whole[i].tensor));
  }
}

TEST_CASE("a bf16 base under LoRA takes half the bytes of an fp32 one; the adapters stay fp32", "[lora]") {
  const bool sharded = GENERATE(true, false);
  CAPTURE(sharded);
  constexpr auto adapted = loom::lora(4, {"q_proj", "v_proj"});
  const auto measure = [&](const auto& plan) {
    if (sharded) {
      auto job = loom::build(plan | loom::fsdp(), world());
      return std::pair(job.local_state_dict(), job.describe());
    }
    auto job = loom::build(plan | loom::ddp(), world());
    return std::pair(job.local_state_dict(), job.describe());
  };
  const auto [fp32_state, fp32_text] = measure(fp32_plan | adapted);
  const auto [bf16_state, bf16_text] =
      measure(loom::model<models::TinyGpt>(small) | loom::seeded(1) | loom::default_dtype(loom::bf16) | adapted);

  const auto base = [](const std::string& name) { return !is_adapter(name); };
  CHECK(2 * storage_bytes(bf16_state, base) == storage_bytes(fp32_state, base));
  CHECK(storage_bytes(bf16_state, is_adapter) == storage_bytes(fp32_state, is_adapter));
  for (const loom::named_tensor& t : bf16_state) {
    CAPTURE(t.name);
    CHECK(t.tensor.scalar_type() == (is_adapter(t.name) ? at::kFloat : at::kBFloat16));
  }
  CHECK_THAT(bf16_text, ContainsSubstring("build: built in bf16\n"));
}

TEST_CASE("default_dtype(bf16) holds what trains in fp32", "[default_dtype]") {
  auto job = loom::build(loom::model<models::TinyGpt>(small) | loom::seeded(1) | loom::default_dtype(loom::bf16) |
                             loom::lora(4, {"q_proj"}) | loom::trainable({"ln_f"}) | loom::ddp(),
                         world());
  for (const auto& item : job.module().named_parameters()) {
    CAPTURE(item.key());
    CHECK(item.value().scalar_type() == (item.value().requires_grad() ? at::kFloat : at::kBFloat16));
  }
  CHECK_THAT(job.describe(), ContainsSubstring("built in bf16, the 2 parameters that train held in fp32"));
}

TEST_CASE("the forward computes in bf16 under autocast and under fsdp(), and output casts its result", "[forward]") {
  const auto input = torch::randn({4, 5});
  const auto result_of = [&](auto&& job) { return job.forward(input).scalar_type(); };
  constexpr auto odd = loom::model<loom::testing::odd_units>() | loom::seeded(2);
  CHECK(result_of(loom::build(odd | loom::mixed_precision() | loom::ddp(), world())) == at::kBFloat16);
  CHECK(result_of(loom::build(odd | loom::mixed_precision() | loom::fsdp(), world())) == at::kBFloat16);
  CHECK(result_of(loom::build(odd | loom::mixed_precision({.output = loom::fp32}) | loom::fsdp(), world())) ==
        at::kFloat);
  CHECK(result_of(loom::build(odd | loom::mixed_precision({.output = loom::fp32}) | loom::ddp(), world())) ==
        at::kFloat);
  // Under autocast the parameters stay fp32 and so do their gradients, which the buckets reduce.
  auto ddp = loom::build(odd | loom::mixed_precision() | loom::ddp(), world());
  for (const at::Tensor& p : ddp.trainable_parameters()) CHECK(p.scalar_type() == at::kFloat);
  CHECK(carries_only(ddp.schedule(), loom::collective_op::all_reduce, at::kFloat));
  CHECK_THAT(ddp.describe(), ContainsSubstring("mixed precision: the forward under autocast(BFloat16)"));
  if (world().is_distributed()) {
    CHECK_THROWS_WITH(loom::build(odd | loom::mixed_precision({.reduce = loom::bf16}) | loom::ddp(), world()),
                      ContainsSubstring("ddp(): mixed_precision reduce = BFloat16 differs from the dtype of the "
                                        "gradients ('in.weight' is Float)"));
  }
}

namespace {

// bf16's unit roundoff: an 8-bit significand rounds to within 2^-8 relative.
const double bf16_roundoff = std::ldexp(1.0, -8);

// 20 AdamW steps of tiny-gpt; each step's loss, averaged over the ranks.
template <class Job>
std::vector<double> losses(Job&& job) {
  torch::optim::AdamW optimizer(job.trainable_parameters(), torch::optim::AdamWOptions(1e-2));
  std::vector<double> curve;
  for (int step = 0; step < 20; ++step) {
    const auto [ids, targets] = tokens(step);
    const at::Tensor loss = job.forward(ids, targets);
    job.backward(loss);
    optimizer.step();
    job.zero_grad();
    at::Tensor mean = loss.detach().to(at::kFloat).reshape({1});
    if (world().is_distributed()) world().comm().all_reduce(mean, loom::reduce_op::mean).wait();
    curve.push_back(mean.item<double>());
  }
  return curve;
}

}  // namespace

TEST_CASE("bf16 training follows fp32's over 20 steps of tiny-gpt", "[curve]") {
  const std::string strategy = GENERATE("local", "ddp", "fsdp", "lora-fsdp");
  if (strategy == "local" && world().is_distributed()) return;  // local() is the 1-rank case
  CAPTURE(strategy);
  constexpr auto mixed = loom::mixed_precision();
  constexpr auto adapted = loom::lora(4, {"q_proj", "k_proj", "v_proj", "o_proj"});
  std::vector<double> fp32, bf16;
  if (strategy == "local") {
    fp32 = losses(loom::build(fp32_plan | loom::local(), world()));
    bf16 = losses(loom::build(fp32_plan | mixed | loom::local(), world()));
  } else if (strategy == "ddp") {
    fp32 = losses(loom::build(fp32_plan | loom::ddp(), world()));
    bf16 = losses(loom::build(fp32_plan | mixed | loom::ddp(), world()));
  } else if (strategy == "fsdp") {
    fp32 = losses(loom::build(fp32_plan | loom::fsdp(), world()));
    bf16 = losses(loom::build(fp32_plan | mixed | loom::fsdp(), world()));
  } else {
    fp32 = losses(loom::build(fp32_plan | adapted | loom::fsdp(), world()));
    bf16 = losses(loom::build(loom::model<models::TinyGpt>(small) | loom::seeded(1) | loom::default_dtype(loom::bf16) |
                                  adapted | mixed | loom::fsdp(),
                              world()));
  }
  // Within 8 roundoffs of bf16, relative: a bf16 loss is itself rounded to 1 (fsdp() computes it from
  // bf16 logits), and 20 steps of AdamW at 1e-2 carry each step's rounding into the weights; PyTorch's
  // own FSDP2 bf16 run of this model and its fp32 run differ by at most 5.7e-3 (2^-7.5) per step.
  double largest = 0;
  for (std::size_t step = 0; step < fp32.size(); ++step) {
    CAPTURE(step, fp32[step], bf16[step]);
    CHECK(std::abs(bf16[step] - fp32[step]) <= 8 * bf16_roundoff * fp32[step]);
    largest = std::max(largest, std::abs(bf16[step] - fp32[step]) / fp32[step]);
  }
  // And it is mixed precision: the curve is not the fp32 one.
  CHECK(largest > 0);
}

namespace {

// odd_units with every block's `up` used or not in a forward: so a parameter can be first used in
// the last micro-batch, or only in the first.
struct gated_units : torch::nn::Module {
  using Block = loom::nn::Unit<loom::testing::odd_block>;

  gated_units()
      : in(register_module("in", loom::nn::Linear(5, 5))),
        blocks(register_module("blocks", torch::nn::ModuleList())),
        out(register_module("out", loom::nn::Linear(5, 3))) {
    for (int i = 0; i < 2; ++i) blocks->push_back(std::make_shared<Block>());
  }

  at::Tensor forward(const at::Tensor& x, bool use_up) {
    at::Tensor h = in(x);
    for (auto& block : *blocks) h = block->as<Block>()->forward(h, use_up);
    return out(h);
  }

  loom::nn::Linear in;
  torch::nn::ModuleList blocks;
  loom::nn::Linear out;
};

at::Tensor micro_batch_loss(auto& job, int micro_batch, bool use_up) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(50 + 10 * static_cast<std::uint64_t>(world().rank()) +
                                                      static_cast<std::uint64_t>(micro_batch));
  const at::Tensor x = torch::randn({6, 5}, gen);
  const at::Tensor y = torch::randn({6, 3}, gen);
  return torch::mse_loss(job.forward(x, use_up).to(at::kFloat), y);
}

std::vector<at::Tensor> gradients(auto& job) {
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : job.trainable_parameters()) {
    grads.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
  }
  return grads;
}

}  // namespace

TEST_CASE("fsdp() no_sync under bf16 accumulates in the reduce dtype, whichever micro-batch uses a parameter",
          "[fsdp][no_sync]") {
  const bool first_uses_up = GENERATE(false, true);
  CAPTURE(first_uses_up);
  constexpr auto plan = loom::model<gated_units>() | loom::seeded(3) | loom::mixed_precision() | loom::fsdp();
  auto accumulated = loom::build(plan, world());
  {
    auto accumulate = accumulated.no_sync();
    accumulated.backward(micro_batch_loss(accumulated, 0, first_uses_up));
  }
  accumulated.backward(micro_batch_loss(accumulated, 1, !first_uses_up));

  // The same micro-batches each reduced on its own, their fp32 gradients added: what accumulating
  // in fp32 gives, up to fp32's rounding; accumulating in bf16 would be off by up to 2^-9.
  auto separate = loom::build(plan, world());
  separate.backward(micro_batch_loss(separate, 0, first_uses_up));
  const std::vector<at::Tensor> first = gradients(separate);
  separate.zero_grad();
  separate.backward(micro_batch_loss(separate, 1, !first_uses_up));
  const std::vector<at::Tensor> second = gradients(separate);

  const std::vector<at::Tensor> actual = gradients(accumulated);
  REQUIRE(actual.size() == first.size());
  for (std::size_t i = 0; i < actual.size(); ++i) {
    CAPTURE(i);
    const at::Tensor expected = !first[i].defined()    ? second[i]
                                : !second[i].defined() ? first[i]
                                                       : first[i] + second[i];
    REQUIRE(actual[i].defined() == expected.defined());
    if (!expected.defined()) continue;
    CHECK(actual[i].scalar_type() == at::kFloat);
    CHECK(torch::allclose(actual[i], expected, 1e-5, 1e-7));
  }
}

TEST_CASE("merge and unmerge under bf16 fsdp() change the fp32 master weights", "[fsdp][lora]") {
  constexpr auto plan = loom::model<models::TinyGpt>(small) | loom::seeded(1) | loom::lora(4, {"q_proj"}) |
                        loom::mixed_precision() | loom::fsdp();
  auto job = loom::build(plan, world());
  torch::optim::AdamW optimizer(job.trainable_parameters(), torch::optim::AdamWOptions(1e-2));
  for (int step = 0; step < 3; ++step) {
    const auto [ids, targets] = tokens(step);
    job.backward(job.forward(ids, targets));
    optimizer.step();
    job.zero_grad();
  }
  const loom::tensor_state before = job.state_dict();
  job.merge();
  const loom::tensor_state merged = job.state_dict();
  job.unmerge();
  const loom::tensor_state after = job.state_dict();
  std::map<std::string, at::Tensor> by_name;
  for (const loom::named_tensor& t : merged) by_name.emplace(t.name, t.tensor);
  for (std::size_t i = 0; i < before.size(); ++i) {
    CAPTURE(before[i].name);
    CHECK(before[i].tensor.scalar_type() == at::kFloat);
    // Folded in and taken out again in fp32: back to within fp32's rounding, not bf16's.
    CHECK(torch::allclose(after[i].tensor, before[i].tensor, 1e-6, 1e-6));
    if (before[i].name.ends_with("q_proj.weight")) CHECK(!torch::equal(by_name.at(before[i].name), before[i].tensor));
  }
  // The adapters PEFT loads are the fp32 masters too.
  const std::filesystem::path folder = std::filesystem::temp_directory_path() / "loom-dist-mixed-precision" /
                                       (std::to_string(world().world_size()) + "-ranks") / "adapter";
  job.save_adapter(folder);
  for (const loom::named_tensor& t : loom::load_peft_adapter(folder).tensors) {
    CAPTURE(t.name);
    CHECK(t.tensor.scalar_type() == at::kFloat);
  }
}

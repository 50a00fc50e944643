// A model with branches (loom::nn::Branch: two experts, one a pass, as Wan 2.2 A14B's) under fsdp(),
// at 1, 2 and 3 ranks, in the user's own loop (torch::optim::AdamW, opt.zero_grad()): the expert of
// each step drawn by loom::flow_matching::expert_for_step, the same on every rank; trained like one
// process on the whole batch (local()); each pass issues its expert's collectives and the shared
// ones, in the schedule's order, and none of the other expert's; the expert not taken keeps its
// weights bit for bit; LoRA adapters in each expert are reduced in their expert's buckets. Both
// model forms. What fsdp() refuses of such a model, and what the other stages refuse.
#include "two_experts.hpp"
#include "world.hpp"

#include <loom/loom.hpp>
#include <loom/train/flow_matching.hpp>

#include <torch/optim/adamw.h>
#include <torch/torch.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cstdint>
#include <map>
#include <set>
#include <string>

using Catch::Matchers::ContainsSubstring;
using loom::testing::world;

namespace {

using loom::testing::TwoExperts;
using loom::testing::width;

constexpr std::uint64_t seed = 11;
constexpr std::int64_t steps = 8;

struct SubclassTwoExperts : loom::testing::TwoExpertsImpl {  // the subclass form
  using TwoExpertsImpl::TwoExpertsImpl;
};

const loom::flow_matching& experts_method() {
  static const loom::flow_matching method({.boundary_ratio = 0.5});
  return method;
}

// A rank's rows of step `step`: every rank's differ, and every step's.
at::Tensor rows(std::int64_t step, int rank) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(900 + 17 * static_cast<std::uint64_t>(step) +
                                                      static_cast<std::uint64_t>(rank));
  return torch::randn({3, width}, gen).to(world().device());
}

template <class Job>
at::Tensor loss_of(Job& job, const at::Tensor& x, loom::noise_expert expert) {
  return job.forward(x, expert).square().mean();
}

std::map<std::string, at::Tensor> by_name(const loom::tensor_state& state) {
  std::map<std::string, at::Tensor> named;
  for (const loom::named_tensor& t : state) named.emplace(t.name, t.tensor.clone());
  return named;
}

std::string expert_prefix(loom::noise_expert expert) {
  return expert == loom::noise_expert::high_noise ? "high." : "low.";
}

// Trains `plan` under fsdp() on this rank's rows and the reference, one process's local(), on the
// mean of every rank's loss, step by step; checks the issued entries and the expert not taken.
template <class Plan, class Reference>
void train_against_one_process(const Plan& plan, const Reference& reference_plan) {
  auto sharded = loom::build(plan, world());
  auto reference = loom::build(reference_plan, world());
  torch::optim::AdamW sharded_opt(sharded.trainable_parameters(), torch::optim::AdamWOptions(1e-2));
  torch::optim::AdamW reference_opt(reference.trainable_parameters(), torch::optim::AdamWOptions(1e-2));
  const auto entries = sharded.schedule().entries();
  std::set<loom::noise_expert> taken;
  for (std::int64_t step = 0; step < steps; ++step) {
    const loom::noise_expert expert = experts_method().expert_for_step(seed, step);
    taken.insert(expert);
    CAPTURE(step, loom::to_string(expert));
    const auto before = by_name(sharded.state_dict());

    sharded_opt.zero_grad();
    sharded.backward(loss_of(sharded, rows(step, world().rank()), expert));
    sharded_opt.step();

    reference_opt.zero_grad();
    at::Tensor total = at::zeros({}, at::TensorOptions().device(world().device()));
    for (int r = 0; r < world().world_size(); ++r) total = total + loss_of(reference, rows(step, r), expert);
    reference.backward(total / world().world_size());
    reference_opt.step();

    // The expert's collectives and the shared ones, each once, in the schedule's order; none of the other's.
    const std::string taken_name = expert == loom::noise_expert::high_noise ? "high" : "low";
    std::set<std::size_t> issued;
    std::size_t previous = 0;
    for (const std::size_t index : sharded.strategy().issued_entries()) {
      CHECK((issued.empty() || index > previous));
      previous = index;
      issued.insert(index);
      CHECK((entries[index].branch.empty() || entries[index].branch == taken_name));
    }
    for (std::size_t i = 0; i < entries.size(); ++i) {
      CAPTURE(entries[i].to_string());
      if (entries[i].branch.empty() || entries[i].branch == taken_name) CHECK(issued.contains(i));
    }
    // The expert not taken kept its weights, AdamW's decay included: its gradients stayed unset.
    const std::string other = expert_prefix(expert == loom::noise_expert::high_noise ? loom::noise_expert::low_noise
                                                                                     : loom::noise_expert::high_noise);
    for (const auto& [name, value] : by_name(sharded.state_dict())) {
      CAPTURE(name);
      if (name.starts_with(other)) CHECK(torch::equal(value, before.at(name)));
    }
  }
  CHECK(taken.size() == 2);  // both experts trained over the steps
  const auto whole = by_name(reference.state_dict());
  for (const auto& [name, value] : by_name(sharded.state_dict())) {
    CAPTURE(name);
    CHECK(torch::allclose(value, whole.at(name), 1e-5, 1e-5));
  }
}

template <class M>
void check_model_form() {
  SECTION("whole model") {
    const bool reshard = GENERATE(true, false);
    CAPTURE(reshard);
    train_against_one_process(loom::model<M>() | loom::seeded(5) | loom::fsdp({.reshard_after_forward = reshard}),
                              loom::model<M>() | loom::seeded(5) | loom::local());
  }
  SECTION("lora in both experts: the adapters replicated, reduced in their expert's buckets") {
    const auto adapters = loom::model<M>() | loom::seeded(5) | loom::lora(4, {"up", "down"});
    auto job = loom::build(adapters | loom::fsdp(), world());
    std::set<std::string> adapter_branches;
    for (const loom::schedule_entry& entry : job.schedule().entries()) {
      if (entry.op == loom::collective_op::all_reduce) adapter_branches.insert(entry.branch);
    }
    if (world().world_size() > 1) CHECK(adapter_branches == std::set<std::string>{"high", "low"});
    train_against_one_process(adapters | loom::fsdp(), adapters | loom::local());
  }
}

}  // namespace

TEST_CASE("fsdp: two experts, one a step, equal one process on the whole batch", "[branches][fsdp]") {
  SECTION("a TORCH_MODULE holder") { check_model_form<TwoExperts>(); }
  SECTION("a Module subclass") { check_model_form<SubclassTwoExperts>(); }
}

TEST_CASE("the schedule marks each expert's collectives, and a step with no expert issues neither's",
          "[branches][fsdp]") {
  auto job = loom::build(loom::model<TwoExperts>() | loom::seeded(5) | loom::fsdp(), world());
  std::map<std::string, int> by_branch;
  for (const loom::schedule_entry& entry : job.schedule().entries()) {
    ++by_branch[entry.branch];
    if (!entry.branch.empty()) CHECK_THAT(entry.to_string(), ContainsSubstring(" if " + entry.branch + " ["));
  }
  CHECK(by_branch.at("high") > 0);
  CHECK(by_branch.at("low") > by_branch.at("high"));  // three units to two
  const auto& first = job.schedule().entries()[1];    // after the root's gather: every rank's branch, checked
  CHECK(first.to_string() == "all_gather forward world 8 B [(branch taken) Long[1]]");
  // The embedding alone: no branch taken, and the experts' collectives passed over.
  job.backward(job.forward(rows(0, world().rank())).square().mean());
  for (const std::size_t index : job.strategy().issued_entries()) CHECK(job.schedule().entries()[index].branch.empty());
}

TEST_CASE("what fsdp() and the other stages refuse of a model with branches", "[branches]") {
  SECTION("ddp()") {
    CHECK_THROWS_WITH(loom::build(loom::model<TwoExperts>() | loom::seeded(5) | loom::ddp(), world()),
                      ContainsSubstring("ddp(): the model has branches ('high' and the rest), of which a pass runs "
                                        "one"));
  }
  SECTION("sequence_parallel and tensor_parallel") {
    if (world().world_size() != 2) return;
    CHECK_THROWS_WITH(
        loom::build(loom::model<TwoExperts>() | loom::seeded(5) | loom::sequence_parallel(2) | loom::fsdp(), world()),
        ContainsSubstring("sequence_parallel(2) with "));
    CHECK_THROWS_WITH(
        loom::build(loom::model<TwoExperts>() | loom::seeded(5) | loom::tensor_parallel(2) | loom::fsdp(), world()),
        ContainsSubstring("the model has branches ('high' and the rest), of which a pass runs one, and "
                          "tensor_parallel's exchanges are checked in the same order in every pass"));
  }
  SECTION("local() runs both in one pass") {
    auto job = loom::build(loom::model<TwoExperts>() | loom::seeded(5) | loom::local(), world());
    CHECK(job.forward(rows(0, 0), /*both_experts=*/true).sizes() == at::IntArrayRef{3, width});
  }
}

TEST_CASE("expert_for_step: the same on every rank, the low-noise expert at the boundary's rate", "[branches]") {
  int low = 0;
  for (std::int64_t step = 0; step < 2000; ++step) {
    const auto expert = experts_method().expert_for_step(seed, step);
    low += expert == loom::noise_expert::low_noise ? 1 : 0;
    if (step < 50) CHECK(loom::testing::same_on_every_rank(at::full({1}, static_cast<int>(expert))));
  }
  CHECK(std::abs(low / 2000.0 - 0.5) < 0.04);
}

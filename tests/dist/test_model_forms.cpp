// Both forms a model takes (a ModuleHolder made by TORCH_MODULE, and a torch::nn::Module subclass)
// through everything a job does with its module: loom::train with checkpoints, evaluation and
// resume, adapters and weights in and out, merge and unmerge, state_dict; under local() (one
// process), ddp() and fsdp(), at 1, 2 and 3 ranks. Each rank's data differs, step by step.
#include "world.hpp"

#include <loom/loom.hpp>
#include <loom/train/loop.hpp>

#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>
#include <torch/torch.h>

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>

#include <filesystem>
#include <string>

using loom::testing::shared_scratch;
using loom::testing::world;

namespace {

namespace fs = std::filesystem;

struct NetImpl : torch::nn::Module {
  NetImpl()
      : q_proj(register_module("q_proj", loom::nn::Linear(6, 8))),
        v_proj(register_module("v_proj", loom::nn::Linear(8, 3))) {}
  at::Tensor forward(const at::Tensor& x) { return v_proj(torch::tanh(q_proj(x))); }
  loom::nn::Linear q_proj, v_proj;
};
TORCH_MODULE(Net);                // the holder form
struct SubclassNet : NetImpl {};  // the subclass form

// This rank's batch of `step`: another on every rank and at every step.
std::pair<at::Tensor, at::Tensor> batch(std::int64_t step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100 * static_cast<std::uint64_t>(step) +
                                                      static_cast<std::uint64_t>(world().rank()));
  return {torch::randn({4, 6}, gen), torch::randn({4, 3}, gen)};
}

bool same(const loom::tensor_state& a, const loom::tensor_state& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name || !torch::equal(a[i].tensor, b[i].tensor)) return false;
  }
  return true;
}

// Trains `steps` steps in all with a checkpoint every 2 and an evaluation every 2, resuming from
// what `out` holds.
template <class Job>
loom::train_result train(Job& job, std::int64_t steps, const fs::path& out) {
  torch::optim::SGD optimizer(job.trainable_parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  const auto loss = [&job](std::int64_t step) {
    auto [x, y] = batch(step);
    return torch::mse_loss(job.forward(x), y);
  };
  return loom::train(
      job, optimizer,
      {.loss = [&](std::int64_t step, int) { return loss(step); }, .eval_loss = [&] { return loss(1000); }},
      {.steps = steps, .out = out, .checkpoint_every = 2, .eval_every = 2});
}

// Resuming at step 4 of 6 ends where 6 steps straight end.
template <class Plan>
void check_train_and_resume(const Plan& plan, const std::string& name) {
  auto straight = loom::build(plan, world());
  REQUIRE(train(straight, 6, shared_scratch("model-forms", name + "-straight")).last_step == 6);
  const fs::path out = shared_scratch("model-forms", name + "-stopped");
  {
    auto first = loom::build(plan, world());
    REQUIRE(train(first, 4, out).last_step == 4);
  }
  auto resumed = loom::build(plan, world());
  const loom::train_result result = train(resumed, 6, out);
  CHECK(result.first_step == 5);
  CHECK(result.last_step == 6);
  CHECK(same(straight.state_dict(), resumed.state_dict()));
}

at::Tensor probe() { return torch::linspace(-1, 1, 12).view({2, 6}); }

template <class Job>
at::Tensor output(Job& job) {
  torch::NoGradGuard no_grad;
  return job.forward(probe());
}

// Adapters and base weights out of a trained job and into a fresh one of another seed; merge and
// unmerge.
template <class M, class Strategy>
void check_files_and_merge(const Strategy& strategy, const std::string& name) {
  constexpr auto adapters = loom::lora(2, {"q_proj", "v_proj"}, {.alpha = 3});
  auto trained = loom::build(loom::model<M>() | loom::seeded(5) | adapters | strategy, world());
  train(trained, 2, shared_scratch("model-forms", name + "-adapt"));
  const fs::path files = shared_scratch("model-forms", name + "-files");
  trained.save_adapter(files / "adapter");
  trained.save_weights(files / "base");

  auto other = loom::build(loom::model<M>() | loom::seeded(99) | adapters | strategy, world());
  REQUIRE_FALSE(same(trained.state_dict(), other.state_dict()));
  (void)other.load_weights(files / "base");
  other.load_adapter(files / "adapter");
  CHECK(same(trained.state_dict(), other.state_dict()));

  const at::Tensor before = output(other);
  other.merge();
  CHECK_FALSE(same(trained.state_dict(), other.state_dict()));
  CHECK(torch::allclose(output(other), before, 1e-5, 1e-6));
  other.unmerge();
  CHECK(torch::allclose(output(other), before, 1e-5, 1e-6));
}

template <class M>
std::string form() {
  return loom::detail::module_holder<M> ? "holder" : "subclass";
}

}  // namespace

TEMPLATE_TEST_CASE("train with checkpoints and resume, for both model forms and every strategy", "[forms]", Net,
                   SubclassNet) {
  constexpr auto plan = loom::model<TestType>() | loom::seeded(5);
  const std::string name = form<TestType>();
  if (world().world_size() == 1) check_train_and_resume(plan | loom::local(), name + "-local");
  check_train_and_resume(plan | loom::ddp(), name + "-ddp");
  check_train_and_resume(plan | loom::fsdp(), name + "-fsdp");
  check_train_and_resume(plan | loom::lora(2, {"q_proj"}) | loom::fsdp(), name + "-lora-fsdp");
}

TEMPLATE_TEST_CASE("adapters, weights, merge and state_dict, for both model forms and every strategy", "[forms]", Net,
                   SubclassNet) {
  if (world().world_size() == 1) check_files_and_merge<TestType>(loom::local(), form<TestType>() + "-local");
  check_files_and_merge<TestType>(loom::ddp(), form<TestType>() + "-ddp");
  check_files_and_merge<TestType>(loom::fsdp(), form<TestType>() + "-fsdp");
}

TEST_CASE("a forward with no backward under fsdp() keeps the whole root's bytes", "[forms][fsdp]") {
  auto job = loom::build(loom::model<Net>() | loom::seeded(5) | loom::fsdp(), world());
  const at::Tensor first = output(job);
  const void* bytes = job.module()->q_proj->weight.const_data_ptr();
  REQUIRE(bytes != nullptr);
  // The evaluation's forward gathers the root again into the storage it already holds.
  CHECK(torch::equal(output(job), first));
  CHECK(job.module()->q_proj->weight.const_data_ptr() == bytes);
}

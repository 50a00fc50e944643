// tensor_parallel(k)'s state at 2 ranks (tp 2) and 4 (tp 2 × 2 data-parallel ranks), under ddp() and
// fsdp(), in a user's own loop: the clipped norm counts the split parameters' slices and the others
// once, as the unsplit run's does; state_dict(), save_weights and save_adapter are whole and equal
// the unsplit run's, and what they wrote loads back split; a checkpoint resumes bit for bit at the
// same layout (and in others: tensor_parallel_reshard.cpp); pretrained(...) reads each rank's slices.
#include "same_state.hpp"
#include "small_models.hpp"
#include "world.hpp"

#include <loom/loom.hpp>
#include <loom/models/causal_lm.hpp>

#include <torch/torch.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

using Catch::Matchers::ContainsSubstring;
using loom::testing::difference;
using loom::testing::shared_scratch;
using loom::testing::split_llama;
using loom::testing::world;

namespace {

constexpr int tp = 2;

at::Tensor token_batch(int step, int data_rank) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(4000 + 31 * static_cast<std::uint64_t>(step) +
                                                      static_cast<std::uint64_t>(data_rank));
  return torch::randint(64, {2, 10 + step % 3}, gen, torch::kLong);
}

// The batch of this rank's tensor group at `step`, which the unsplit job's ranks read too.
template <class Job>
at::Tensor step_loss(Job& job, int step) {
  const at::Tensor ids = token_batch(step, world().rank() / tp);
  return job.forward(ids, ids);
}

std::map<std::string, at::Tensor> by_name(const loom::tensor_state& state) {
  std::map<std::string, at::Tensor> named;
  for (const auto& t : state) named.emplace(t.name, t.tensor.detach().to(at::kFloat));
  return named;
}

void check_same(const loom::tensor_state& split, const loom::tensor_state& whole, double tolerance) {
  const auto a = by_name(split), b = by_name(whole);
  REQUIRE(a.size() == b.size());
  for (const auto& [name, value] : a) {
    CAPTURE(name);
    REQUIRE(b.contains(name));
    REQUIRE(value.sizes() == b.at(name).sizes());
    CHECK(difference(value, b.at(name)) <= tolerance);
  }
}

// Three SGD steps, each clipped to a norm the gradients exceed: the split job's norm and state stay
// the unsplit one's.
template <class Split, class Whole>
void train_both(Split& split, Whole& whole, int steps) {
  torch::optim::SGD split_optimizer(split.trainable_parameters(), torch::optim::SGDOptions(0.5));
  torch::optim::SGD whole_optimizer(whole.trainable_parameters(), torch::optim::SGDOptions(0.5));
  for (int step = 0; step < steps; ++step) {
    CAPTURE(step);
    split.backward(step_loss(split, step));
    whole.backward(step_loss(whole, step));
    const at::Tensor split_norm = split.clip_grad_norm(0.05);
    const at::Tensor whole_norm = whole.clip_grad_norm(0.05);
    CHECK(split_norm.item<double>() > 0.05);
    CHECK(difference(split_norm, whole_norm) <= 1e-6);
    const at::Tensor split_max = split.clip_grad_norm(1e9, INFINITY);
    CHECK(difference(split_max, whole.clip_grad_norm(1e9, INFINITY)) <= 1e-6);
    split_optimizer.step();
    whole_optimizer.step();
    split_optimizer.zero_grad();
    whole_optimizer.zero_grad();
  }
}

template <class Strategy>
void check_state(const Strategy& strategy, bool adapters, const std::string& name) {
  const auto split_stage = loom::tensor_parallel_stage::checked({.size = tp});
  const auto base = loom::model<loom::models::CausalLM>(split_llama(2)) | loom::seeded(3);
  const auto lora = loom::lora(4, {"q_proj", "v_proj", "o_proj", "down_proj"});
  const std::filesystem::path dir = shared_scratch("tensor-parallel-state", name);
  const auto run = [&](const auto& plan) {
    auto split = loom::build(plan | split_stage | strategy, world());
    auto whole = loom::build(plan | strategy, world());
    check_same(split.state_dict(), whole.state_dict(), 0);
    train_both(split, whole, 3);
    check_same(split.state_dict(), whole.state_dict(), 1e-5);
    split.save_weights(dir / "split-weights");
    whole.save_weights(dir / "whole-weights");
    check_same(loom::load_weights(dir / "split-weights"), loom::load_weights(dir / "whole-weights"), 1e-5);
    if (adapters) {
      split.save_adapter(dir / "split-adapter");
      whole.save_adapter(dir / "whole-adapter");
      check_same(loom::load_weights(dir / "split-adapter" / "adapter_model.safetensors"),
                 loom::load_weights(dir / "whole-adapter" / "adapter_model.safetensors"), 1e-5);
      // The unsplit run's adapter, loaded by a fresh split job: its slices of it, then the same state.
      auto loaded = loom::build(plan | split_stage | strategy, world());
      loaded.load_adapter(dir / "whole-adapter");
      check_same(loaded.state_dict(), whole.state_dict(), 1e-5);
    }
    // The unsplit run's weights, loaded by a fresh split job.
    auto reloaded = loom::build(plan | split_stage | strategy, world());
    (void)reloaded.load_weights(dir / "whole-weights", /*strict=*/!adapters);
    loom::tensor_state base_only;
    for (const auto& t : whole.state_dict()) {
      if (t.name.find("lora_") == std::string::npos) base_only.push_back(t);
    }
    loom::tensor_state reloaded_base;
    for (const auto& t : reloaded.state_dict()) {
      if (t.name.find("lora_") == std::string::npos) reloaded_base.push_back(t);
    }
    check_same(reloaded_base, base_only, 0);
  };
  if (adapters) {
    run(base | lora);
  } else {
    run(base);
  }
}

// What describe()'s "weights from '…': N tensors, R of their T bytes read on this rank" says was read.
std::int64_t bytes_read(const std::string& described) {
  const auto end = described.find(" of their ");
  REQUIRE(end != std::string::npos);
  const auto begin = described.rfind(' ', end - 1) + 1;
  return std::stoll(described.substr(begin, end - begin));
}

// Six steps in one go, and three, a checkpoint, and three more in a job built anew: the same losses
// and the same state, bit for bit.
template <class Strategy>
void check_resume(const Strategy& strategy, const std::string& name) {
  const auto plan = loom::model<loom::models::CausalLM>(split_llama(2)) | loom::seeded(5) |
                    loom::lora(4, {"q_proj", "o_proj", "up_proj"}) | loom::tensor_parallel(2) | strategy;
  const std::filesystem::path dir = shared_scratch("tensor-parallel-state", name);
  const auto adamw = [](auto& job) {
    return torch::optim::AdamW(job.trainable_parameters(), torch::optim::AdamWOptions(1e-2));
  };
  std::vector<double> straight;
  loom::tensor_state straight_state;
  {
    auto job = loom::build(plan, world());
    auto optimizer = adamw(job);
    for (int step = 0; step < 6; ++step) {
      const at::Tensor loss = step_loss(job, step);
      job.backward(loss);
      (void)job.clip_grad_norm(0.1);
      optimizer.step();
      optimizer.zero_grad();
      straight.push_back(loss.item<double>());
    }
    straight_state = job.local_state_dict();
    for (auto& t : straight_state) t.tensor = t.tensor.detach().clone();
  }
  {
    auto job = loom::build(plan, world());
    auto optimizer = adamw(job);
    loom::checkpointer checkpoints(world(), {.folder = dir});
    for (int step = 0; step < 3; ++step) {
      job.backward(step_loss(job, step));
      (void)job.clip_grad_norm(0.1);
      optimizer.step();
      optimizer.zero_grad();
    }
    checkpoints.save(job, optimizer, 3);
    checkpoints.wait();
  }
  auto job = loom::build(plan, world());
  auto optimizer = adamw(job);
  loom::checkpointer checkpoints(world(), {.folder = dir});
  const auto resumed = checkpoints.resume(job, optimizer);
  REQUIRE(resumed);
  for (int step = 3; step < 6; ++step) {
    CAPTURE(step);
    const at::Tensor loss = step_loss(job, step);
    job.backward(loss);
    (void)job.clip_grad_norm(0.1);
    optimizer.step();
    optimizer.zero_grad();
    CHECK(loss.item<double>() == straight[static_cast<std::size_t>(step)]);
  }
  const auto resumed_state = job.local_state_dict();
  REQUIRE(resumed_state.size() == straight_state.size());
  for (std::size_t i = 0; i < resumed_state.size(); ++i) {
    CAPTURE(resumed_state[i].name);
    CHECK(at::equal(resumed_state[i].tensor, straight_state[i].tensor));
  }
}

}  // namespace

TEST_CASE("tensor_parallel: the clipped norm and the whole state are the unsplit run's", "[tensor_parallel]") {
  REQUIRE(world().world_size() % tp == 0);
  const bool adapters = GENERATE(false, true);
  CAPTURE(adapters);
  check_state(loom::ddp(), adapters, adapters ? "ddp-lora" : "ddp");
  check_state(loom::fsdp(), adapters, adapters ? "fsdp-lora" : "fsdp");
  // At 4 ranks, hybrid sharding over the 2 data-parallel ranks: shards of one rank, replicated twice.
  if (world().world_size() == 4) {
    check_state(loom::fsdp({.shard_group_size = 1}), adapters, adapters ? "hsdp-lora" : "hsdp");
  }
}

TEST_CASE("tensor_parallel on a world its size does not divide is refused on every rank, naming both", "[.odd-world]") {
  REQUIRE(world().world_size() % tp != 0);
  try {
    (void)loom::build(
        loom::model<loom::models::CausalLM>(split_llama(2)) | loom::seeded(1) | loom::tensor_parallel(2) | loom::ddp(),
        world());
    FAIL("built");
  } catch (const std::exception& error) {
    CHECK_THAT(error.what(), ContainsSubstring("tensor_parallel(2) does not divide the world of 3 ranks"));
  }
}

TEST_CASE("tensor_parallel's collectives are schedule entries, checked across ranks at build", "[tensor_parallel]") {
  auto job =
      loom::build(loom::model<loom::models::CausalLM>(split_llama(2)) | loom::seeded(1) |
                      loom::lora(4, {"q_proj", "o_proj"}) | loom::recompute() | loom::tensor_parallel(2) | loom::fsdp(),
                  world());
  const std::string schedule = job.schedule().to_string();
  CAPTURE(schedule);
  // The embedding's lookups and each rowwise layer's partial output (its adapter's too) in forward,
  // again in recompute, and each colwise layer's input gradient in backward; per token, in fp32.
  CHECK_THAT(schedule, ContainsSubstring("all_reduce forward tensor[2] 128 B/token [model.embed_tokens lookups"));
  CHECK_THAT(schedule,
             ContainsSubstring("all_reduce forward tensor[2] 128 B/token [model.layers.0.self_attn.o_proj partial"));
  CHECK_THAT(schedule, ContainsSubstring("all_reduce forward tensor[2] 16 B/token "
                                         "[model.layers.0.self_attn.o_proj adapter partial output"));
  CHECK_THAT(schedule, ContainsSubstring("all_reduce recompute tensor[2] 128 B/token [model.layers.1.mlp.down_proj"));
  CHECK_THAT(schedule,
             ContainsSubstring("all_reduce backward tensor[2] 128 B/token [model.layers.0.self_attn.q_proj input"));
  CHECK_THAT(schedule, ContainsSubstring("all_reduce backward tensor[2] 16 B/token "
                                         "[model.layers.0.self_attn.q_proj adapter input gradient"));
}

TEST_CASE("tensor_parallel: a checkpoint resumes bit for bit at the same layout", "[tensor_parallel]") {
  check_resume(loom::ddp(), "resume-ddp");
  check_resume(loom::fsdp(), "resume-fsdp");
}

TEST_CASE("tensor_parallel: pretrained(...) reads each rank's slices of the split tensors and no more",
          "[tensor_parallel]") {
  const std::filesystem::path dir = shared_scratch("tensor-parallel-state", "pretrained");
  auto source =
      loom::build(loom::model<loom::models::CausalLM>(split_llama(2)) | loom::seeded(8) | loom::ddp(), world());
  source.save_weights(dir / "weights");
  const loom::tensor_state saved = loom::load_weights(dir / "weights");
  const auto plan = loom::model<loom::models::CausalLM>(split_llama(2)) |
                    loom::pretrained_stage::checked((dir / "weights").string()) |
                    loom::tensor_parallel_stage::checked({.size = tp});
  // Under ddp() a rank reads its slice of each split tensor and the others whole: to the byte.
  auto replicated = loom::build(plan | loom::ddp(), world());
  check_same(replicated.state_dict(), saved, 0);
  const std::map<std::string, loom::tensor_layout> layouts = replicated.whole_layouts();
  std::int64_t slices = 0;
  int split_tensors = 0;
  for (const auto& t : saved) {
    const bool split = layouts.at(t.name).split_dim.has_value();
    slices += static_cast<std::int64_t>(t.tensor.nbytes()) / (split ? tp : 1);
    split_tensors += split ? 1 : 0;
  }
  CHECK(split_tensors > 10);  // the embedding, the attentions' and MLPs' projections and the head
  CHECK(bytes_read(replicated.describe()) == slices);
  // Under fsdp() a rank reads its rows of its slices: at most as much, less across 2 data-parallel ranks.
  auto sharded = loom::build(plan | loom::fsdp(), world());
  check_same(sharded.state_dict(), saved, 0);
  if (world().world_size() == tp) {
    CHECK(bytes_read(sharded.describe()) == slices);
  } else {
    CHECK(bytes_read(sharded.describe()) < slices);
  }
}

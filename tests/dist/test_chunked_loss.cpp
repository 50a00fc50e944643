// CausalLM's chunked loss, job.forward(ids, labels), against the unchunked one,
// causal_lm_loss(job.forward(ids), labels[, sequence]), in a user's own loop (torch::optim::SGD and its
// zero_grad): under local() at 1 rank, ddp() and fsdp() at 2 and 3, each alone and with
// sequence_parallel over every rank; a LoRA adapter on the head (and on q and v), and a tied head
// trained whole. Six steps of batches that differ by step and by rank, labels of -100 among them, and
// a chunk of 5 tokens that divides none of them: every step's loss and every gradient of this rank's
// trainable tensors (its shards under fsdp) within fp32 rounding, and the same state at the end.
#include "same_state.hpp"
#include "small_models.hpp"
#include "world.hpp"

#include <loom/loom.hpp>
#include <loom/models/causal_lm.hpp>

#include <torch/optim/sgd.h>
#include <torch/torch.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <utility>

using loom::testing::difference;
using loom::testing::small_llama;
using loom::testing::world;

namespace {

constexpr int steps = 6;
constexpr double tolerance = 1e-5;

enum class strategy_kind { local, ddp, fsdp };
enum class head_kind { lora, tied };

std::string_view name_of(strategy_kind s) {
  switch (s) {
    case strategy_kind::local: return "local";
    case strategy_kind::ddp: return "ddp";
    case strategy_kind::fsdp: return "fsdp";
  }
  return "?";
}

std::string_view name_of(head_kind h) { return h == head_kind::lora ? "lora-on-the-head" : "tied-head"; }

// The batch of `data_rank` at `step`: 12 or 24 tokens (which 1, 2 and 3 ranks divide), their values
// by step and rank, three labels left out.
std::pair<at::Tensor, at::Tensor> batch(int step, int data_rank) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(300 + 53 * static_cast<std::uint64_t>(step) +
                                                      static_cast<std::uint64_t>(data_rank));
  const std::int64_t length = step % 2 == 0 ? 12 : 24;
  const at::Tensor ids = torch::randint(64, {2, length}, gen, torch::kLong);
  at::Tensor labels = ids.clone();
  labels.index_put_({0, (step * 5) % length}, -100);
  labels.index_put_({1, (step * 7 + 3) % length}, -100);
  labels.index_put_({1, length - 1}, -100);
  return {ids, labels};
}

template <class Job>
at::Tensor loss_of(Job& job, int step, bool chunked, bool split) {
  const auto [ids, labels] = batch(step, job.data_rank());
  if (chunked) return job.forward(ids, labels);
  const at::Tensor logits = job.forward(ids);
  if (split) return loom::models::causal_lm_loss(logits, labels, job.module()->model->sequence);
  return loom::models::causal_lm_loss(logits, labels);
}

template <class Plan>
void check_both_losses(const Plan& plan, bool split) {
  auto unchunked = loom::build(plan, world());
  auto chunked = loom::build(plan, world());
  chunked.module()->loss_chunk_tokens = 5;
  const auto sgd = [](auto& job) {
    return torch::optim::SGD(job.trainable_parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  };
  torch::optim::SGD unchunked_optimizer = sgd(unchunked), chunked_optimizer = sgd(chunked);
  loom::tensor_state before = unchunked.state_dict();
  for (loom::named_tensor& t : before) t.tensor = t.tensor.clone();
  for (int step = 0; step < steps; ++step) {
    CAPTURE(step);
    unchunked_optimizer.zero_grad();
    chunked_optimizer.zero_grad();
    const at::Tensor unchunked_loss = loss_of(unchunked, step, false, split);
    unchunked.backward(unchunked_loss);
    const at::Tensor chunked_loss = loss_of(chunked, step, true, split);
    chunked.backward(chunked_loss);
    CHECK(chunked_loss.scalar_type() == at::kFloat);
    CHECK(difference(chunked_loss.detach(), unchunked_loss.detach()) <= tolerance);
    const std::vector<at::Tensor> a = chunked.trainable_parameters();
    const std::vector<at::Tensor> b = unchunked.trainable_parameters();
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      CAPTURE(i);
      REQUIRE(a[i].grad().defined() == b[i].grad().defined());
      if (a[i].grad().defined() && b[i].grad().numel() > 0) CHECK(difference(a[i].grad(), b[i].grad()) <= tolerance);
    }
    unchunked_optimizer.step();
    chunked_optimizer.step();
  }
  // The whole state, gathered: the adapters (or every weight) trained alike, and trained.
  const loom::tensor_state x = chunked.state_dict(), y = unchunked.state_dict();
  REQUIRE(x.size() == y.size());
  bool moved = false;
  for (std::size_t i = 0; i < x.size(); ++i) {
    CAPTURE(x[i].name);
    REQUIRE(x[i].name == y[i].name);
    if (!x[i].tensor.is_floating_point() || x[i].tensor.numel() == 0) continue;
    CHECK(difference(x[i].tensor, y[i].tensor) <= 10 * tolerance);
    moved = moved || !torch::equal(y[i].tensor, before[i].tensor);
  }
  CHECK(moved);
}

template <class Strategy>
void check_head(head_kind head, const Strategy& strategy, bool split) {
  loom::models::causal_lm_config config = small_llama();
  config.tie_word_embeddings = head == head_kind::tied;
  const auto base = loom::model<loom::models::CausalLM>(config) | loom::seeded(5);
  const auto sp = loom::sequence_parallel_stage::checked({.size = static_cast<std::size_t>(world().world_size())});
  const auto adapters = loom::lora(4, {"q_proj", "v_proj", "lm_head"});
  if (head == head_kind::lora) {
    if (split) {
      check_both_losses(base | adapters | sp | strategy, true);
    } else {
      check_both_losses(base | adapters | strategy, false);
    }
  } else if (split) {
    check_both_losses(base | sp | strategy, true);
  } else {
    check_both_losses(base | strategy, false);
  }
}

}  // namespace

TEST_CASE("the chunked loss trains as the unchunked one, step by step", "[chunked-loss]") {
  const bool distributed = world().world_size() > 1;
  const strategy_kind strategy = GENERATE(strategy_kind::local, strategy_kind::ddp, strategy_kind::fsdp);
  const bool split = GENERATE(false, true);
  const head_kind head = GENERATE(head_kind::lora, head_kind::tied);
  if (distributed == (strategy == strategy_kind::local)) return;  // local() alone, at 1 rank alone
  if (split && !distributed) return;
  CAPTURE(name_of(strategy), split, name_of(head));
  switch (strategy) {
    case strategy_kind::local: check_head(head, loom::local(), split); break;
    case strategy_kind::ddp: check_head(head, loom::ddp(), split); break;
    case strategy_kind::fsdp: check_head(head, loom::fsdp(), split); break;
  }
}

// tensor_parallel(k) across real processes: tp 2 at 2 ranks (the whole world one group) and tp 2 ×
// 2 data-parallel ranks at 4, for Llama with grouped-query attention (both model forms), Qwen3 (q and
// k norms), Gemma 3 (its tied head, sandwich norms, soft-capping, sliding window) and Wan (self- and
// cross-attention, its q and k norms across heads, the feed-forward), under ddp() and fsdp(), plain,
// with LoRA, with recompute and in bf16, in a user's own loop (torch::optim::SGD,
// zero_grad), against the same plan without the stage on the same ranks reading the same batches:
// every step's loss and every gradient within 1e-5 of the largest (the split one's slice of the
// unsplit one's), and the state after ten steps; and the errors a user meets.
#include "same_state.hpp"
#include "small_models.hpp"
#include "world.hpp"

#include <loom/loom.hpp>
#include <loom/models/causal_lm.hpp>
#include <loom/models/wan.hpp>
#include <loom/nn/tensor_parallel.hpp>
#include <loom/runtime/tensor_group.hpp>

#include <torch/torch.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

using Catch::Matchers::ContainsSubstring;
using loom::testing::difference;
using loom::testing::world;

namespace {

constexpr int tp = 2;

loom::models::causal_lm_config small_llama() {
  loom::models::causal_lm_config config;
  config.vocab_size = 64;
  config.hidden_size = 48;
  config.intermediate_size = 40;
  config.num_hidden_layers = 3;
  config.num_attention_heads = 6;
  config.num_key_value_heads = 2;
  config.head_dim = 8;
  return config;
}

loom::models::causal_lm_config small_family(loom::models::causal_lm_family family) {
  return loom::testing::small_family(family, small_llama());
}

// 4 heads of 8 features (32 in all) and a feed-forward of 40, which tp splits into 2 heads and 20 columns.
loom::models::wan_config small_wan() {
  loom::models::wan_config config;
  config.num_attention_heads = 4;
  config.attention_head_dim = 8;
  config.in_channels = 4;
  config.out_channels = 4;
  config.text_dim = 16;
  config.freq_dim = 16;
  config.ffn_dim = 40;
  config.num_layers = 2;
  config.rope_max_seq_len = 32;
  return config;
}

// The LoRA variants' adapters, over colwise and rowwise bases.
constexpr loom::lora_stage llama_adapters = loom::lora(4, {"q_proj", "v_proj", "o_proj", "down_proj"});

struct SubclassLlama : loom::models::CausalLMImpl {  // the subclass form
  using CausalLMImpl::CausalLMImpl;
};

// The model a job holds, of either form.
template <class Job>
auto& module_of(Job& job) {
  if constexpr (loom::detail::module_holder<std::remove_cvref_t<decltype(job.module())>>) {
    return *job.module();
  } else {
    return job.module();
  }
}

// The batch of data-parallel rank `data_rank` at `step`: its length and values vary by step and rank.
at::Tensor token_batch(int step, int data_rank) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3000 + 37 * static_cast<std::uint64_t>(step) +
                                                      static_cast<std::uint64_t>(data_rank));
  return torch::randint(64, {2, step % 2 == 0 ? 12 : 17}, gen, torch::kLong);
}

at::Tensor labels_of(const at::Tensor& ids, int step) {
  at::Tensor labels = ids.clone();
  labels.index_put_({0, (step * 5) % ids.size(1)}, -100);
  labels.index_put_({1, (step * 7 + 3) % ids.size(1)}, -100);
  return labels;
}

struct video_batch {
  at::Tensor latents, timestep, text, target;
};

// Latents of 3 or 6 frames of 4 × 4 (12 or 24 tokens after 1 × 2 × 2 patches), integer timesteps
// (which mixed_precision's cast keeps) and 5 text states, varying by step and data rank.
video_batch wan_batch(int step, int data_rank) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5000 + 37 * static_cast<std::uint64_t>(step) +
                                                      static_cast<std::uint64_t>(data_rank));
  const std::int64_t frames = step % 2 == 0 ? 3 : 6;
  return {torch::randn({2, 4, frames, 4, 4}, gen), torch::randint(0, 1000, {2}, gen, torch::kLong),
          torch::randn({2, 5, 16}, gen), torch::randn({2, 4, frames, 4, 4}, gen)};
}

// This rank's slice of an unsplit tensor, as `split` holds it: along the one dimension whose size
// differs, k times the split one's.
at::Tensor slice_like(const at::Tensor& whole, const at::Tensor& split, int tp_rank) {
  REQUIRE(whole.dim() == split.dim());
  for (std::int64_t d = 0; d < whole.dim(); ++d) {
    if (whole.size(d) == split.size(d)) continue;
    REQUIRE(whole.size(d) == tp * split.size(d));
    return whole.narrow(d, split.size(d) * tp_rank, split.size(d));
  }
  return whole;
}

// Every trainable parameter by name, whole (the split job's slices), in fp32: `grads` their gradients.
template <class Job>
std::map<std::string, at::Tensor> named_values(Job& job, bool grads) {
  std::map<std::string, at::Tensor> values;
  job.with_whole_module([&](auto&) {
    for (const auto& item : module_of(job).named_parameters()) {
      if (!item.value().requires_grad()) continue;
      const at::Tensor& t = grads ? item.value().grad() : item.value();
      if (t.defined()) values.emplace(item.key(), t.detach().to(at::kFloat).clone());
    }
  });
  return values;
}

template <class Split, class Whole>
void check_same_values(const std::map<std::string, at::Tensor>& split, const std::map<std::string, at::Tensor>& whole,
                       double tolerance) {
  REQUIRE(split.size() == whole.size());
  const int tp_rank = world().rank() % tp;
  for (const auto& [name, value] : split) {
    CAPTURE(name);
    REQUIRE(whole.contains(name));
    CHECK(difference(value, slice_like(whole.at(name), value, tp_rank)) <= tolerance);
  }
}

enum class variant { plain, lora, recompute, bf16 };

std::string name_of(variant v) {
  switch (v) {
    case variant::plain: return "plain";
    case variant::lora: return "lora";
    case variant::recompute: return "recompute";
    case variant::bf16: return "bf16";
  }
  return "?";
}

// The loss of a CausalLM job on data rank `data_rank`'s batch at `step`: through forward(ids, labels),
// the loss over the split vocabulary, or through the logits, gathered whole.
auto llama_loss(bool chunked) {
  return [chunked](auto& job, int step, int data_rank) {
    const at::Tensor ids = token_batch(step, data_rank);
    if (chunked) return job.forward(ids, labels_of(ids, step));
    return loom::models::causal_lm_loss(job.forward(ids), labels_of(ids, step));
  };
}

// The mean squared error of a Wan job's prediction for data rank `data_rank`'s batch at `step`, in fp32.
template <class Job>
at::Tensor wan_loss(Job& job, int step, int data_rank) {
  const video_batch batch = wan_batch(step, data_rank);
  const at::Tensor predicted = job.forward(batch.latents, batch.timestep, batch.text);
  return torch::mse_loss(predicted.to(at::kFloat), batch.target);
}

// Ten SGD steps of the split and unsplit jobs on the same batches, in the user's own loop, with the
// loss `loss_of(job, step, data_rank)`: each step's loss, and its gradients where the strategy keeps
// them on the module (ddp), within `tolerance`; the parameters after each step. With a `reference`
// (bf16's fp32 run): each tensor of the split run no further from it than 4 times the unsplit run
// is, as sequence_parallel's test bounds bf16, or than 4 times the unsplit run's median distance over
// the model's tensors where that is larger. The floor is needed because one tensor's distance is one
// draw of bf16's rounding noise over a few elements: some tensors are nearly untouched by the
// exact gradient (attention's key bias is, softmax being blind to it), and the unsplit run's draw
// on them can be far below the model's, as a new machine's kernels showed (4.7 and 6.6 times).
template <class Split, class Whole, class Reference, class Loss>
void check_same_training(Split& split, Whole& whole, Reference* reference, const Loss& loss_of, bool module_grads,
                         double tolerance, int steps = 10) {
  REQUIRE(split.data_rank() == world().rank() / tp);
  REQUIRE(split.data_world_size() == world().world_size() / tp);
  const auto sgd = [](auto& job) {
    return torch::optim::SGD(job.trainable_parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  };
  torch::optim::SGD split_optimizer = sgd(split), whole_optimizer = sgd(whole);
  std::optional<torch::optim::SGD> reference_optimizer;
  if (reference != nullptr) reference_optimizer.emplace(sgd(*reference));
  const int data_rank = world().rank() / tp;
  for (int step = 0; step < steps; ++step) {
    CAPTURE(step);
    const at::Tensor split_loss = loss_of(split, step, data_rank);
    split.backward(split_loss);
    const at::Tensor whole_loss = loss_of(whole, step, data_rank);
    whole.backward(whole_loss);
    if (reference != nullptr) {
      reference->backward(loss_of(*reference, step, data_rank));
      CHECK(difference(split_loss.detach(), whole_loss.detach()) <= 1.0 / 256);
    } else {
      CHECK(difference(split_loss.detach(), whole_loss.detach()) <= tolerance);
      if (module_grads)
        check_same_values<Split, Whole>(named_values(split, true), named_values(whole, true), tolerance);
    }
    split_optimizer.step();
    whole_optimizer.step();
    split_optimizer.zero_grad();
    whole_optimizer.zero_grad();
    if (reference != nullptr) {
      reference_optimizer->step();
      reference_optimizer->zero_grad();
    }
  }
  const auto split_values = named_values(split, false), whole_values = named_values(whole, false);
  if (reference == nullptr) {
    check_same_values<Split, Whole>(split_values, whole_values, 10 * tolerance);
    return;
  }
  const auto fp32 = named_values(*reference, false);
  const int tp_rank = world().rank() % tp;
  std::map<std::string, std::pair<double, double>> distances;  // split's and unsplit's from the truth
  std::vector<double> unsplit_distances;
  for (const auto& [name, value] : split_values) {
    const at::Tensor truth = slice_like(fp32.at(name), value, tp_rank);
    const double unsplit = difference(slice_like(whole_values.at(name), value, tp_rank), truth);
    distances[name] = {difference(value, truth), unsplit};
    unsplit_distances.push_back(unsplit);
  }
  const auto middle = unsplit_distances.begin() + static_cast<std::ptrdiff_t>(unsplit_distances.size() / 2);
  std::nth_element(unsplit_distances.begin(), middle, unsplit_distances.end());
  const double unsplit_median = *middle;
  for (const auto& [name, distance] : distances) {
    CAPTURE(name, unsplit_median);
    CHECK(distance.first <= 4 * std::max(distance.second, unsplit_median) + 1e-5);
  }
}

// The split and unsplit jobs of `model_stage` for `v` and `strategy`, checked as above; `adapters` for
// the LoRA variants.
template <class ModelStage, class Strategy, class Loss>
void check_variant(const ModelStage& model_stage, variant v, const Strategy& strategy, const Loss& loss_of,
                   const loom::lora_stage& adapters, bool module_grads, int steps = 10) {
  const auto split_stage = loom::tensor_parallel_stage::checked({.size = tp});
  const auto run = [&](const auto& plan, const auto* reference_plan) {
    auto split = loom::build(plan | split_stage | strategy, world());
    auto whole = loom::build(plan | strategy, world());
    CHECK_THAT(split.describe(), ContainsSubstring("tensor parallel"));
    if (reference_plan == nullptr) {
      check_same_training(split, whole, static_cast<decltype(whole)*>(nullptr), loss_of, module_grads, 1e-5, steps);
    } else {
      auto reference = loom::build(*reference_plan | strategy, world());
      check_same_training(split, whole, &reference, loss_of, module_grads, 1e-5, steps);
    }
  };
  const auto seeded = model_stage | loom::seeded(7);
  using seeded_plan = std::remove_cvref_t<decltype(seeded)>;
  switch (v) {
    case variant::plain: run(seeded, static_cast<const seeded_plan*>(nullptr)); break;
    case variant::lora: run(seeded | adapters, static_cast<const seeded_plan*>(nullptr)); break;
    case variant::recompute:
      run(seeded | loom::recompute() | adapters, static_cast<const seeded_plan*>(nullptr));
      break;
    case variant::bf16: run(seeded | loom::mixed_precision({.param = loom::bf16}), &seeded); break;
  }
}

}  // namespace

TEST_CASE("Llama with tensor_parallel: the unsplit run's losses, gradients and state", "[tensor_parallel]") {
  REQUIRE(world().world_size() % tp == 0);
  const variant v = GENERATE(variant::plain, variant::lora, variant::recompute, variant::bf16);
  const bool chunked = GENERATE(true, false);
  CAPTURE(name_of(v), chunked);
  check_variant(loom::model<loom::models::CausalLM>(small_llama()), v, loom::ddp(), llama_loss(chunked), llama_adapters,
                true);
  check_variant(loom::model<SubclassLlama>(small_llama()), v, loom::fsdp(), llama_loss(chunked), llama_adapters, false);
}

TEST_CASE("Qwen3 and Gemma 3 with tensor_parallel: the unsplit run's losses, gradients and state",
          "[tensor_parallel]") {
  const auto family = GENERATE(loom::models::causal_lm_family::qwen3, loom::models::causal_lm_family::gemma3);
  const variant v = GENERATE(variant::plain, variant::lora);
  CAPTURE(static_cast<int>(family), name_of(v));
  check_variant(loom::model<loom::models::CausalLM>(small_family(family)), v, loom::ddp(), llama_loss(true),
                llama_adapters, true, 6);
  check_variant(loom::model<loom::models::CausalLM>(small_family(family)), v, loom::fsdp(), llama_loss(true),
                llama_adapters, false, 6);
}

TEST_CASE("Wan with tensor_parallel: the unsplit run's losses, gradients and state", "[tensor_parallel]") {
  REQUIRE(world().world_size() % tp == 0);
  const variant v = GENERATE(variant::plain, variant::lora, variant::recompute, variant::bf16);
  CAPTURE(name_of(v));
  const auto model = loom::model<loom::models::Wan>(small_wan());
  const auto adapters = loom::lora(4, {"to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj"});
  const auto loss = [](auto& job, int step, int data_rank) { return wan_loss(job, step, data_rank); };
  check_variant(model, v, loom::ddp(), loss, adapters, true);
  check_variant(model, v, loom::fsdp(), loss, adapters, false);
}

TEST_CASE("Wan's split layers: each rank holds its heads' projections and norms and its feed-forward columns",
          "[tensor_parallel]") {
  auto job = loom::build(
      loom::model<loom::models::Wan>(small_wan()) | loom::seeded(1) | loom::tensor_parallel(2) | loom::ddp(), world());
  const loom::models::WanImpl& wan = module_of(job);
  const auto& block = wan.blocks->at<loom::models::WanTransformerBlock>(0);
  for (const loom::models::WanAttention& attention : {block.attn1, block.attn2}) {
    CHECK(attention->to_q->weight.size(0) == 16);
    CHECK(attention->to_k->weight.size(0) == 16);
    CHECK(attention->to_v->weight.size(0) == 16);
    CHECK(attention->norm_q->weight.size(0) == 16);
    CHECK(attention->norm_k->weight.size(0) == 16);
    CHECK(attention->out_proj->weight.size(1) == 16);
  }
  CHECK(block.ffn->project_in->proj->weight.size(0) == 20);
  CHECK(block.ffn->project_out->weight.size(1) == 20);
  CHECK(wan.proj_out->weight.size(1) == 32);
}

TEST_CASE("tensor_parallel's groups: consecutive ranks split, the strategy runs over the rest", "[tensor_parallel]") {
  auto job = loom::build(
      loom::model<loom::models::CausalLM>(small_llama()) | loom::seeded(1) | loom::tensor_parallel(2) | loom::fsdp(),
      world());
  CHECK(job.rank() == world().rank());
  CHECK(job.world_size() == world().world_size());
  CHECK(job.data_rank() == world().rank() / 2);
  CHECK(job.data_world_size() == world().world_size() / 2);
  const loom::models::CausalLMImpl& model = module_of(job);
  CHECK(model.model->embed_tokens->weight.size(0) == 32);
  CHECK(model.lm_head->weight.size(0) == 32);
}

// What building `plan` throws (a failed check when it builds).
template <class Plan>
std::string refusal(const Plan& plan) {
  try {
    (void)loom::build(plan, world());
  } catch (const std::exception& error) {
    return error.what();
  }
  FAIL("built");
  return {};
}

TEST_CASE("tensor_parallel's refusals name the numbers and the fix", "[tensor_parallel]") {
  const auto split = loom::seeded(1) | loom::tensor_parallel(2) | loom::ddp();
  SECTION("a size that does not divide the key-value heads") {
    loom::models::causal_lm_config config = small_llama();
    config.num_key_value_heads = 3;
    config.num_attention_heads = 6;
    const std::string message = refusal(loom::model<loom::models::CausalLM>(config) | split);
    CHECK_THAT(message, ContainsSubstring("3 key-value heads"));
    CHECK_THAT(message, ContainsSubstring("num_key_value_heads"));
  }
  SECTION("a size that does not divide Wan's heads") {
    loom::models::wan_config config = small_wan();
    config.num_attention_heads = 3;
    const std::string message = refusal(loom::model<loom::models::Wan>(config) | split);
    CHECK_THAT(message, ContainsSubstring("attn1.attention has 3 attention heads"));
    CHECK_THAT(message, ContainsSubstring("num_attention_heads"));
  }
  SECTION("a size that does not divide the MLP width") {
    loom::models::causal_lm_config config = small_llama();
    config.intermediate_size = 41;
    CHECK_THAT(refusal(loom::model<loom::models::CausalLM>(config) | split),
               ContainsSubstring("mlp.gate_proj has 41 output features"));
  }
  SECTION("LoRA dropout") {
    CHECK_THAT(refusal(loom::model<loom::models::CausalLM>(small_llama()) | loom::seeded(1) |
                       loom::lora(4, {"q_proj"}, {.dropout = 0.1}) | loom::tensor_parallel(2) | loom::ddp()),
               ContainsSubstring("lora dropout"));
  }
}

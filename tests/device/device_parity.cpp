// The same plan on any device and process group gives the same model. Usage (under loom-run):
//   device-parity {ddp|fsdp|fsdp-eval|recompute-ddp|recompute-fsdp|lora-fsdp|bf16-ddp|bf16-fsdp|lora-bf16-fsdp|
//                  hsdp|wan-fsdp|wan-lora-fsdp|wan-lora-bf16-fsdp|wan-sp-fsdp|wan-tp-fsdp|fsdp-offload|lora-fsdp-offload}
//                  OUT.safetensors STEPS [START.safetensors]
// trains a small TinyGpt with loom::train (SGD with momentum, accumulation, clipping; no run folder;
// fsdp-eval: fsdp() with an evaluation every 2 steps, a forward with no backward; hsdp: hybrid
// sharding in groups of 2 ranks; recompute-*: every block recomputed in backward; bf16-*: under
// mixed_precision(), the lora one over a base built in bf16; wan-*: a small loom::models::Wan by flow
// matching, LoRA on FastVideo's targets; wan-sp-fsdp: each clip split across sequence groups of 2
// ranks; wan-tp-fsdp: LoRA over layers split across tensor groups of 2 ranks (written whole); *-offload: under
// fsdp({.offload = true}), on a GPU only, the shards in pinned host memory) on the runtime's device (LOOM_DEVICE,
// LOOM_BACKEND), each data-parallel rank on its own batches drawn on the CPU by (step, job.data_rank()), and rank 0
// writes the whole model (gathered under fsdp()) to OUT, and before training to START when it is given; on CUDA each
// rank prints its peak allocated memory. parity.py compares two such runs from one start: CUDA against CPU
// (scripts/gpu-check), one launched rank with its own process group against a plain single process (CI).
//
// SGD, not AdamW: its step is linear in the gradient, so the kernels' last-bit differences stay that
// small in the weights and a difference the engine makes shows at full size. AdamW divides each
// element by its own history, which turns rounding noise on a gradient that is zero in exact
// arithmetic into steps of the full rate; test-adamw compares its fused CUDA kernel with the CPU's.
#include <loom/io/safetensors.hpp>
#include <loom/loom.hpp>
#include <loom/models/wan.hpp>
#include <models/tiny_gpt.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <fmt/format.h>

#include <cstdlib>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace {

constexpr models::tiny_gpt_config small{.vocab = 32, .d = 32, .layers = 3, .heads = 2, .ctx = 16};

// Two blocks of 2 heads of 12 channels (the rotary embedding's frame, row and column 4 each).
loom::models::wan_config small_wan() {
  loom::models::wan_config config;
  config.num_attention_heads = 2;
  config.attention_head_dim = 12;
  config.in_channels = config.out_channels = 4;
  config.text_dim = 16;
  config.freq_dim = 16;
  config.ffn_dim = 32;
  config.num_layers = 2;
  config.rope_max_seq_len = 32;
  return config;
}

// A batch of 4 sequences and their next tokens, drawn on the CPU by `gen`.
at::Tensor tiny_gpt_loss(auto& job, at::Generator& gen) {
  const at::Tensor x = torch::randint(0, small.vocab, {4, small.ctx}, gen).to(job.rt().device());
  const at::Tensor y = torch::randint(0, small.vocab, {4, small.ctx}, gen).to(job.rt().device());
  return job.forward(x, y);
}

// Flow matching on 2 clips' latents (2 frames of 8 × 8: 32 patches each) and 5 text states, drawn on
// the CPU by `gen` (noise and levels too), so that every device trains on the same numbers.
at::Tensor wan_loss(auto& job, at::Generator& gen) {
  static const loom::flow_matching method({.weighting_scheme = loom::timestep_density::logit_normal});
  const loom::models::wan_config config = small_wan();
  const at::Tensor x0 = torch::randn({2, config.in_channels, 2, 8, 8}, gen);
  const at::Tensor text = torch::randn({2, 5, config.text_dim}, gen);
  loom::flow_matching_inputs inputs = method.noise(x0, gen);
  const c10::Device device = job.rt().device();
  for (at::Tensor* t : {&inputs.noisy, &inputs.timesteps, &inputs.sigmas, &inputs.velocity}) *t = t->to(device);
  return loom::flow_matching::loss(job.forward(inputs.noisy, inputs.timesteps, text.to(device)), inputs);
}

template <class Plan, class Loss>
void run(const Plan& plan, Loss batch_loss, const std::filesystem::path& out, std::int64_t steps,
         const std::optional<std::filesystem::path>& start, std::int64_t eval_every = 0) {
  auto job = loom::build(plan, loom::runtime::from_env());
  const loom::runtime& rt = job.rt();
  const auto rank = static_cast<std::uint64_t>(rt.rank());
  if (start) {
    loom::tensor_state state = job.state_dict();
    if (rank == 0) loom::save_safetensors(*start, state);
  }
  torch::optim::SGD optimizer(job.trainable_parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  const auto data_rank = static_cast<std::uint64_t>(job.data_rank());
  const auto loss = [&](std::uint64_t seed) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    return batch_loss(job, gen);
  };
  const loom::train_result result = loom::train(
      job, optimizer,
      {.loss =
           [&](std::int64_t step, int micro) {
             return loss(1000 * static_cast<std::uint64_t>(step) + 10 * data_rank + static_cast<std::uint64_t>(micro));
           },
       .eval_loss = [&] { return loss(7 + data_rank); }},
      {.steps = steps, .accumulate = 2, .clip_norm = 0.5, .eval_every = eval_every, .log_every = steps});
  if (rank == 0) fmt::print("{}final loss {:.6f}\n", job.describe(), result.last_loss);
  if (rt.device().is_cuda()) {
    // CUDA's caching allocator's high-water mark of allocated bytes: what recompute lowers.
    const auto stats = c10::getDeviceAllocator(c10::kCUDA)->getDeviceStats(rt.device().index());
    const auto aggregate = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    fmt::print("rank {}: peak allocated {:.2f} MiB\n", rank,
               static_cast<double>(stats.allocated_bytes[aggregate].peak) / (1 << 20));
  }
  loom::tensor_state state = job.state_dict();
  if (rank == 0) loom::save_safetensors(out, state);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    fmt::print(stderr,
               "usage: device-parity "
               "{{ddp|fsdp|fsdp-eval|recompute-ddp|recompute-fsdp|lora-fsdp|bf16-ddp|bf16-fsdp|lora-bf16-fsdp|hsdp|"
               "wan-fsdp|wan-lora-fsdp|wan-lora-bf16-fsdp|wan-sp-fsdp|wan-tp-fsdp|fsdp-offload|lora-fsdp-offload}} "
               "OUT.safetensors STEPS "
               "[START.safetensors]\n");
    return 2;
  }
  const std::string_view strategy = argv[1];
  const std::filesystem::path out = argv[2];
  const std::int64_t steps = std::atoll(argv[3]);
  const std::optional<std::filesystem::path> start =
      argc == 5 ? std::optional<std::filesystem::path>(argv[4]) : std::nullopt;
  // cuDNN's convolutions (Wan's patch embedding) run in TF32 by PyTorch's default, 1e-3 off fp32;
  // the comparison is of loom's engine, so both sides compute in fp32.
  at::globalContext().setAllowTF32CuDNN(false);
  try {
    const auto base = loom::model<models::TinyGpt>(small) | loom::seeded(5);
    const auto gpt = [](auto& job, at::Generator& gen) { return tiny_gpt_loss(job, gen); };
    const auto wan = loom::model<loom::models::Wan>(small_wan()) | loom::seeded(5);
    const auto wan_adapters = loom::lora(4, {"to_q", "to_k", "to_v", "to_out"});
    const auto flow = [](auto& job, at::Generator& gen) { return wan_loss(job, gen); };
    if (strategy == "ddp") {
      run(base | loom::ddp(), gpt, out, steps, start);
    } else if (strategy == "fsdp") {
      run(base | loom::fsdp(), gpt, out, steps, start);
    } else if (strategy == "hsdp") {
      run(base | loom::fsdp({.shard_group_size = 2}), gpt, out, steps, start);
    } else if (strategy == "fsdp-eval") {
      run(base | loom::fsdp(), gpt, out, steps, start, /*eval_every=*/2);
    } else if (strategy == "recompute-ddp") {
      run(base | loom::recompute() | loom::ddp(), gpt, out, steps, start);
    } else if (strategy == "recompute-fsdp") {
      run(base | loom::recompute() | loom::fsdp(), gpt, out, steps, start);
    } else if (strategy == "lora-fsdp") {
      run(base | loom::lora(4, {"q_proj", "v_proj"}) | loom::fsdp(), gpt, out, steps, start);
    } else if (strategy == "fsdp-offload") {
      run(base | loom::fsdp({.offload = true}), gpt, out, steps, start);
    } else if (strategy == "lora-fsdp-offload") {
      run(base | loom::lora(4, {"q_proj", "v_proj"}) | loom::fsdp({.offload = true}), gpt, out, steps, start);
    } else if (strategy == "bf16-ddp") {
      run(base | loom::mixed_precision() | loom::ddp(), gpt, out, steps, start);
    } else if (strategy == "bf16-fsdp") {
      run(base | loom::mixed_precision() | loom::fsdp(), gpt, out, steps, start);
    } else if (strategy == "lora-bf16-fsdp") {
      run(base | loom::default_dtype(loom::bf16) | loom::lora(4, {"q_proj", "v_proj"}) | loom::mixed_precision() |
              loom::fsdp(),
          gpt, out, steps, start);
    } else if (strategy == "wan-fsdp") {
      run(wan | loom::fsdp(), flow, out, steps, start);
    } else if (strategy == "wan-lora-fsdp") {
      run(wan | wan_adapters | loom::fsdp(), flow, out, steps, start);
    } else if (strategy == "wan-lora-bf16-fsdp") {
      run(wan | loom::default_dtype(loom::bf16) | wan_adapters | loom::mixed_precision() | loom::fsdp(), flow, out,
          steps, start);
    } else if (strategy == "wan-sp-fsdp") {
      run(wan | loom::sequence_parallel(2) | loom::fsdp(), flow, out, steps, start);
    } else if (strategy == "wan-tp-fsdp") {
      run(wan | wan_adapters | loom::tensor_parallel(2) | loom::fsdp(), flow, out, steps, start);
    } else {
      fmt::print(stderr, "device-parity: unknown strategy '{}'\n", strategy);
      return 2;
    }
  } catch (const std::exception& error) {
    fmt::print(stderr, "device-parity: {}\n", error.what());
    return 1;
  }
  return 0;
}

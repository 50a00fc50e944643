// What one step does on a GPU, for scripts/gpu-check (a CUDA build only). Usage, under loom-run:
//   step-probe syncs WORKLOAD               5 steps of loom::train (2 micro-batches, clipping, loom's
//                                           AdamW, each batch moved to the device by loom::to_device as
//                                           the recipes move theirs) with CUDA's sync debug mode on over
//                                           steps 2 and 3, whole and not logged: every call there that
//                                           makes the host wait for the device prints "called a
//                                           synchronizing CUDA operation" (gpu-check counts them; none
//                                           may). The logged steps, the first and the last, read the
//                                           loss on purpose. WORKLOAD: fsdp (the small TinyGpt),
//                                           llama-lora-bf16-fsdp or wan-lora-bf16-fsdp (flow matching):
//                                           loom-bench's plans over hf_anchor.py's shapes, seeded, not
//                                           loaded (a sync is in the code a step runs, not in its weights).
//   step-probe memory                       one step of 16 units of 8192 × 8192 (1.07 billion
//                                           parameters) under fsdp(): the caching allocator's peak
//                                           within each unit, forward and backward, one line each.
//   step-probe save FOLDER                  two asynchronous checkpoints of TinyGpt under fsdp() with
//                                           AdamW: the device memory each save() allocated (none:
//                                           the state is staged into host buffers) and whether the
//                                           second reused the first's buffers.
//   step-probe trace OUT.json               three steps of the small TinyGpt under fsdp(), the third
//                                           profiled (CPU and CUDA): its kernels' time in NCCL, in
//                                           the rest, and overlapped, in a few lines; the trace to OUT.
#include <loom/checkpoint/checkpoint.hpp>
#include <loom/loom.hpp>
#include <loom/models/causal_lm.hpp>
#include <loom/models/wan.hpp>
#include <loom/nn/linear.hpp>
#include <loom/nn/unit.hpp>
#include <loom/optim/adamw.hpp>
#include <loom/runtime/host_reads.hpp>
#include <loom/train/flow_matching.hpp>
#include <models/tiny_gpt.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

constexpr models::tiny_gpt_config small{.vocab = 32, .d = 256, .layers = 4, .heads = 4, .ctx = 64};

// CUDA's sync debug mode, from construction to destruction: c10's global setting, so it covers the
// autograd engine's device thread too.
class sync_debug {
 public:
  sync_debug() { c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_WARN); }
  ~sync_debug() { c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED); }
  sync_debug(const sync_debug&) = delete;
  sync_debug& operator=(const sync_debug&) = delete;
};

// Step `step`'s tokens on the rank's device. Drawn before a probe watches: a copy from pageable host
// memory to the device waits for it, and it is the probe's own, not the step's.
at::Tensor tiny_gpt_batch(const loom::runtime& rt, std::int64_t step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<std::uint64_t>(100 * step + rt.rank()));
  return torch::randint(0, small.vocab, {8, small.ctx}, gen).to(rt.device());
}

template <class Job>
at::Tensor tiny_gpt_loss(Job& job, const at::Tensor& x) {
  return job.forward(x, x.roll(-1, 1));
}

// loom::train as a recipe runs it, its loss from loss_of(step, micro), with CUDA's sync debug mode on
// over steps 2 and 3 of 5, whole: from the first micro-batch's loss of step 2 to that of step 4,
// between markers that gpu-check reads.
template <class Job>
void count_step_syncs(Job& job, const std::function<at::Tensor(std::int64_t step, int micro)>& loss_of) {
  loom::optim::AdamW optimizer(job.trainable_parameters(), torch::optim::AdamWOptions(1e-3));
  std::optional<sync_debug> watching;
  loom::train(job, optimizer,
              {.loss =
                   [&](std::int64_t step, int micro) {
                     if (micro == 0 && step == 2) {
                       std::fprintf(stderr, "step-probe: steps 2 and 3 of loom::train begin\n");
                       watching.emplace();
                     } else if (micro == 0 && step == 4) {
                       watching.reset();
                       std::fprintf(stderr, "step-probe: steps 2 and 3 of loom::train end\n");
                     }
                     return loss_of(step, micro);
                   }},
              {.steps = 5,
               .accumulate = 2,
               .clip_norm = 1.0,
               .log_every = 100,
               .log_seconds = std::numeric_limits<double>::infinity()});
}

// A micro-batch's draws on the host, the same on every run.
at::Generator host_draws(std::int64_t step, int micro) {
  return at::make_generator<at::CPUGeneratorImpl>(static_cast<std::uint64_t>(10 * step + micro));
}

void tiny_gpt_step_syncs() {
  auto job =
      loom::build(loom::model<models::TinyGpt>(small) | loom::seeded(5) | loom::fsdp(), loom::runtime::from_env());
  const c10::Device device = job.rt().device();
  count_step_syncs(job, [&](std::int64_t step, int micro) {
    const at::Tensor x = torch::randint(0, small.vocab, {8, small.ctx}, host_draws(step, micro));
    return tiny_gpt_loss(job, loom::to_device(x, device, at::kLong));
  });
}

// hf_anchor.py's LLAMA, the llama-* workloads' Llama 3 shape; its batch, 4 sequences of 256 ids.
void llama_step_syncs() {
  auto config = loom::models::causal_lm_config::for_family(loom::models::causal_lm_family::llama);
  config.vocab_size = 4096;
  config.hidden_size = 256;
  config.intermediate_size = 688;
  config.num_hidden_layers = 4;
  config.num_attention_heads = 4;
  config.num_key_value_heads = 2;
  config.head_dim = 64;
  config.max_position_embeddings = 512;
  config.rope.theta = 500000;
  config.rms_norm_eps = 1e-5;
  constexpr auto adapters =
      loom::lora(16, {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}, {.alpha = 32});
  constexpr auto bf16 = loom::mixed_precision({.param = loom::bf16, .reduce = loom::fp32});
  auto job = loom::build(loom::model<loom::models::CausalLM>(config) | loom::seeded(1234) |
                             loom::default_dtype(loom::bf16) | adapters | bf16 | loom::fsdp(),
                         loom::runtime::from_env());
  const c10::Device device = job.rt().device();
  count_step_syncs(job, [&](std::int64_t step, int micro) {
    const at::Tensor ids = loom::to_device(torch::randint(4096, {4, 256}, host_draws(step, micro)), device, at::kLong);
    return loom::models::causal_lm_loss(job.forward(ids), ids);
  });
}

// hf_anchor.py's WAN, the wan-* workloads' Wan 2.1 shape, trained by flow matching as the Wan recipe
// trains it: its latents (1, 16, 5, 32, 32) and text (1, 64, 128) moved to the device in bf16, the
// noise and levels drawn there.
void wan_step_syncs() {
  loom::models::wan_config config;
  config.num_attention_heads = 4;
  config.attention_head_dim = 64;
  config.text_dim = 128;
  config.freq_dim = 64;
  config.ffn_dim = 1024;
  config.num_layers = 4;
  constexpr auto adapters = loom::lora(16, {"to_q", "to_k", "to_v", "to_out.0"}, {.alpha = 16});
  constexpr auto bf16 = loom::mixed_precision({.param = loom::bf16, .reduce = loom::fp32});
  auto job = loom::build(loom::model<loom::models::Wan>(config) | loom::seeded(1234) | loom::default_dtype(loom::bf16) |
                             adapters | bf16 | loom::fsdp(),
                         loom::runtime::from_env());
  const c10::Device device = job.rt().device();
  const loom::flow_matching method({.weighting_scheme = loom::timestep_density::logit_normal}, device);
  count_step_syncs(job, [&](std::int64_t step, int micro) {
    at::Generator host = host_draws(step, micro);
    const at::Tensor latents = torch::randn({1, 16, 5, 32, 32}, host);
    const at::Tensor text = torch::randn({1, 64, 128}, host);
    at::Generator draws = loom::step_generator(7, step, job.rt().rank(), micro, device);
    const loom::flow_matching_inputs inputs = method.noise(loom::to_device(latents, device, at::kBFloat16), draws);
    return loom::flow_matching::loss(
        job.forward(inputs.noisy, inputs.timesteps, loom::to_device(text, device, at::kBFloat16)), inputs);
  });
}

// The caching allocator's high-water mark since the last look, then reset: the peak within a span.
class allocator_peaks {
 public:
  explicit allocator_peaks(c10::Device device) : device_(device) { reset(); }

  void look(std::string_view phase, int unit) {
    const auto stats = c10::getDeviceAllocator(c10::kCUDA)->getDeviceStats(device_.index());
    const auto aggregate = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    fmt::print("{} unit {:2}: peak {:8.1f} MiB, in use {:8.1f} MiB\n", phase, unit,
               static_cast<double>(stats.allocated_bytes[aggregate].peak) / (1 << 20),
               static_cast<double>(stats.allocated_bytes[aggregate].current) / (1 << 20));
    reset();
  }

 private:
  void reset() { c10::getDeviceAllocator(c10::kCUDA)->resetPeakStats(device_.index()); }
  c10::Device device_;
};

struct square_block : torch::nn::Module {
  explicit square_block(std::int64_t width) : fc(register_module("fc", loom::nn::Linear(width, width))) {}
  at::Tensor forward(const at::Tensor& x) { return x + at::gelu(fc(x)); }
  loom::nn::Linear fc;
};

// 16 units of one square layer, a look at the allocator after each unit's forward and before each
// unit's backward.
struct billion : torch::nn::Module {
  using Block = loom::nn::Unit<square_block>;
  static constexpr std::int64_t width = 8192;
  static constexpr int units = 16;

  billion() : blocks(register_module("blocks", torch::nn::ModuleList())) {
    for (int u = 0; u < units; ++u) blocks->push_back(std::make_shared<Block>(width));
  }

  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = x;
    int unit = 0;
    for (auto& block : *blocks) {
      h = block->as<Block>()->forward(h);
      if (peaks) {
        peaks->look("forward ", unit);
        h.register_hook([this, unit](const at::Tensor&) { peaks->look("backward", unit); });
      }
      ++unit;
    }
    return h;
  }

  torch::nn::ModuleList blocks;
  allocator_peaks* peaks = nullptr;
};

void unit_peaks() {
  auto job = loom::build(loom::model<billion>() | loom::seeded(3) | loom::fsdp(), loom::runtime::from_env());
  const c10::Device device = job.rt().device();
  allocator_peaks peaks(device);
  job.module().peaks = &peaks;
  const at::Tensor x = torch::randn({8, billion::width}, at::TensorOptions().device(device));
  job.backward(job.forward(x).square().mean());
  peaks.look("after backward", 0);
}

void staged_saves(const std::string& folder) {
  auto job =
      loom::build(loom::model<models::TinyGpt>(small) | loom::seeded(3) | loom::fsdp(), loom::runtime::from_env());
  torch::optim::AdamW optimizer(job.trainable_parameters(), torch::optim::AdamWOptions(1e-3));
  loom::checkpointer checkpoints(job.rt(), {.folder = folder, .async_save = true});
  c10::DeviceAllocator& allocator = *c10::getDeviceAllocator(c10::kCUDA);
  const auto aggregate = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  std::vector<const void*> first_buffers;
  for (std::int64_t step = 1; step <= 2; ++step) {
    job.backward(tiny_gpt_loss(job, tiny_gpt_batch(job.rt(), step)));
    optimizer.step();
    job.zero_grad();
    c10::cuda::device_synchronize();
    const std::int64_t before = allocator.getDeviceStats(job.rt().device().index()).allocated_bytes[aggregate].current;
    allocator.resetPeakStats(job.rt().device().index());
    checkpoints.save(job, optimizer, step);
    const auto stats = allocator.getDeviceStats(job.rt().device().index());
    fmt::print("save {}: device memory allocated during save(): {} B above the {} B in use before\n", step,
               stats.allocated_bytes[aggregate].peak - before, before);
    if (step == 1) first_buffers = checkpoints.staging_addresses();
  }
  checkpoints.wait();
  fmt::print("the second save staged into the first's host buffers: {} ({} buffers)\n",
             checkpoints.staging_addresses() == first_buffers ? "yes" : "no", first_buffers.size());
}

// The total length of the union of [start, end) spans.
std::uint64_t covered(std::vector<std::pair<std::uint64_t, std::uint64_t>> spans) {
  std::sort(spans.begin(), spans.end());
  std::uint64_t total = 0, reach = 0;
  for (const auto& [start, end] : spans) {
    const std::uint64_t from = std::max(start, reach);
    if (end > from) total += end - from;
    reach = std::max(reach, end);
  }
  return total;
}

void trace(const std::string& out) {
  namespace profiler = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  auto job =
      loom::build(loom::model<models::TinyGpt>(small) | loom::seeded(3) | loom::fsdp(), loom::runtime::from_env());
  torch::optim::SGD optimizer(job.trainable_parameters(), 0.01);
  const auto step = [&](std::int64_t number) {
    job.backward(tiny_gpt_loss(job, tiny_gpt_batch(job.rt(), number)));
    optimizer.step();
    job.zero_grad();
  };
  step(0);
  step(1);
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  const std::set<ActivityType> activities{ActivityType::CPU, ActivityType::CUDA};
  profiler::prepareProfiler(config, activities);
  profiler::enableProfiler(config, activities);
  step(2);
  c10::cuda::device_synchronize();
  const std::unique_ptr<profiler::ProfilerResult> result = profiler::disableProfiler();
  result->save(out);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> nccl, compute;
  std::uint64_t first = UINT64_MAX, last = 0;
  for (const auto& event : result->events()) {
    if (event.deviceType() != c10::DeviceType::CUDA || event.durationNs() == 0) continue;
    const std::pair span{event.startNs(), event.endNs()};
    (event.name().find("nccl") != std::string::npos ? nccl : compute).push_back(span);
    first = std::min(first, span.first);
    last = std::max(last, span.second);
  }
  std::vector<std::pair<std::uint64_t, std::uint64_t>> both = nccl;
  both.insert(both.end(), compute.begin(), compute.end());
  const std::uint64_t nccl_ns = covered(nccl), compute_ns = covered(compute);
  const std::uint64_t overlapped_ns = nccl_ns + compute_ns - covered(both);
  const auto ms = [](std::uint64_t ns) { return static_cast<double>(ns) / 1e6; };
  fmt::print("trace of one fsdp() step: {} NCCL kernels ({:.3f} ms), {} other kernels ({:.3f} ms), over {:.3f} ms\n",
             nccl.size(), ms(nccl_ns), compute.size(), ms(compute_ns), first < last ? ms(last - first) : 0.0);
  fmt::print("NCCL time overlapped with other kernels: {:.3f} ms ({:.0f}%)\n", ms(overlapped_ns),
             nccl_ns > 0 ? 100.0 * static_cast<double>(overlapped_ns) / static_cast<double>(nccl_ns) : 0.0);
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string_view> args(argv + 1, argv + argc);
  try {
    if (args.size() == 2 && args[0] == "syncs" && args[1] == "fsdp") {
      tiny_gpt_step_syncs();
    } else if (args.size() == 2 && args[0] == "syncs" && args[1] == "llama-lora-bf16-fsdp") {
      llama_step_syncs();
    } else if (args.size() == 2 && args[0] == "syncs" && args[1] == "wan-lora-bf16-fsdp") {
      wan_step_syncs();
    } else if (args.size() == 1 && args[0] == "memory") {
      unit_peaks();
    } else if (args.size() == 2 && args[0] == "save") {
      staged_saves(std::string(args[1]));
    } else if (args.size() == 2 && args[0] == "trace") {
      trace(std::string(args[1]));
    } else {
      fmt::print(stderr,
                 "usage: step-probe {{syncs {{fsdp|llama-lora-bf16-fsdp|wan-lora-bf16-fsdp}} | memory | save FOLDER | "
                 "trace OUT.json}}\n");
      return 2;
    }
  } catch (const std::exception& error) {
    fmt::print(stderr, "step-probe: {}\n", error.what());
    return 1;
  }
  return 0;
}

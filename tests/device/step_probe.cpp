// What one step does on a GPU, for scripts/gpu-check (a CUDA build only). Usage, under loom-run:
//   step-probe syncs {fsdp|lora-fsdp|hsdp}  4 steps of a small TinyGpt with CUDA's sync debug mode on
//                                           from each forward to the end of its backward: every call
//                                           there that makes the host wait for the device prints
//                                           "called a synchronizing CUDA operation" (gpu-check counts
//                                           them). The first step, whose setup reads, is left out.
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
#include <loom/nn/linear.hpp>
#include <loom/nn/unit.hpp>
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

template <class Plan>
void count_syncs(const Plan& plan) {
  auto job = loom::build(plan, loom::runtime::from_env());
  torch::optim::SGD optimizer(job.trainable_parameters(), 0.01);
  for (std::int64_t step = 0; step < 4; ++step) {
    const at::Tensor x = tiny_gpt_batch(job.rt(), step);
    if (step > 0) std::fprintf(stderr, "step-probe: forward and backward of step %ld begin\n", static_cast<long>(step));
    {
      std::optional<sync_debug> watching;
      if (step > 0) watching.emplace();
      job.backward(tiny_gpt_loss(job, x));
      (void)job.clip_grad_norm(1.0);
    }
    if (step > 0) std::fprintf(stderr, "step-probe: forward and backward of step %ld end\n", static_cast<long>(step));
    optimizer.step();
    job.zero_grad();
  }
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
    const auto base = loom::model<models::TinyGpt>(small) | loom::seeded(5);
    if (args.size() == 2 && args[0] == "syncs" && args[1] == "fsdp") {
      count_syncs(base | loom::fsdp());
    } else if (args.size() == 2 && args[0] == "syncs" && args[1] == "lora-fsdp") {
      count_syncs(base | loom::lora(4, {"q_proj", "v_proj"}) | loom::fsdp());
    } else if (args.size() == 2 && args[0] == "syncs" && args[1] == "hsdp") {
      count_syncs(base | loom::fsdp({.shard_group_size = 1}));
    } else if (args.size() == 1 && args[0] == "memory") {
      unit_peaks();
    } else if (args.size() == 2 && args[0] == "save") {
      staged_saves(std::string(args[1]));
    } else if (args.size() == 2 && args[0] == "trace") {
      trace(std::string(args[1]));
    } else {
      fmt::print(stderr,
                 "usage: step-probe {{syncs {{fsdp|lora-fsdp|hsdp}} | memory | save FOLDER | trace OUT.json}}\n");
      return 2;
    }
  } catch (const std::exception& error) {
    fmt::print(stderr, "step-probe: {}\n", error.what());
    return 1;
  }
  return 0;
}

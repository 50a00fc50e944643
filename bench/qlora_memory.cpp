// One QLoRA step of a causal LM from a checkpoint, on one sequence of --seq random tokens a rank, and
// what it held: bench/qlora_memory's loom side (docs/benchmarks.md, "Memory: QLoRA"). The plan is
// llama-qlora-bf16-*'s: the base built in bf16, quantized(nf4), LoRA r 16, alpha 32 on the seven
// projections, mixed_precision(bf16, fp32), the loss over chunks of tokens; --recompute recomputes
// every decoder layer, --base bf16 leaves quantized(...) out. Rank 0 prints one JSON line, each figure
// the largest over the ranks: peak RSS, the peak of live CPU tensor bytes (counted exactly), and the
// frozen base's bytes a rank holds.
//
//   build/loom-run --nproc-per-node 2 -- build/bench/qlora-memory --checkpoint DIR --seq 4096 --strategy fsdp
#include "counting_allocator.hpp"

#include <loom/loom.hpp>
#include <loom/models/causal_lm.hpp>
#include <loom/optim/adamw.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/CPUAllocator.h>
#include <fmt/format.h>
#include <sys/resource.h>
#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <exception>
#include <string>

namespace {

constexpr double mib = 1024.0 * 1024.0;

struct options {
  std::string checkpoint;
  std::int64_t seq = 1024;
  std::string strategy = "fsdp";
  std::string base = "nf4";
  bool recompute = false;
  bool describe = false;
};

double peak_rss_mb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // KiB on Linux
}

// What this rank holds of the frozen parameters (its shards under fsdp).
double frozen_mb(const loom::tensor_state& local, const torch::nn::Module& module) {
  std::set<std::string> trains;
  for (const auto& item : module.named_parameters()) {
    if (item.value().requires_grad()) trains.insert(item.key());
  }
  double bytes = 0;
  for (const loom::named_tensor& t : local) {
    if (!trains.contains(t.name)) bytes += static_cast<double>(t.tensor.nbytes());
  }
  return bytes / mib;
}

template <class Plan>
int step(const Plan& plan, const options& o, bench::counting_allocator& counted) {
  auto job = loom::build(plan, loom::runtime::from_env());
  const double built_live_mb = static_cast<double>(counted.peak_bytes()) / mib;
  if (o.describe && job.rt().rank() == 0)
    fmt::print(stderr, "{}\nbuilt: live tensor peak {:.1f} MB\n", job.describe(), built_live_mb);
  loom::optim::AdamW optimizer(job.trainable_parameters(), torch::optim::AdamWOptions(1e-3));
  const at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(99 + job.data_rank());
  const at::Tensor ids = torch::randint(job.module()->config.vocab_size, {1, o.seq}, gen, torch::kLong);
  const auto start = std::chrono::steady_clock::now();
  double run_peak_mb = 0;  // build included
  const auto phase = [&](const char* name) {
    run_peak_mb = std::max(run_peak_mb, static_cast<double>(counted.peak_bytes()) / mib);
    if (o.describe && job.rt().rank() == 0)
      fmt::print(stderr, "{}: live {:.1f} MB, peak since the last {:.1f} MB\n", name,
                 static_cast<double>(counted.live_bytes()) / mib, static_cast<double>(counted.peak_bytes()) / mib);
    counted.reset_peak();
  };
  phase("built");
  optimizer.zero_grad();
  const at::Tensor loss = job.forward(ids, ids);
  phase("forward");
  job.backward(loss);
  phase("backward");
  optimizer.step();
  phase("step");
  const double step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  const at::Tensor mine = torch::tensor(
      {peak_rss_mb(), run_peak_mb, frozen_mb(job.local_state_dict(), *job.module()), step_ms}, torch::kDouble);
  at::Tensor all = at::empty({job.rt().world_size() * mine.numel()}, mine.options());
  job.rt().comm().all_gather(mine, all).wait();
  const at::Tensor worst = std::get<0>(all.view({job.rt().world_size(), mine.numel()}).max(0));
  const double loss_value = loss.item<double>();
  if (job.rt().rank() == 0) {
    const auto* f = worst.const_data_ptr<double>();
    fmt::print(
        "{{\"impl\": \"loom\", \"base\": \"{}\", \"strategy\": \"{}\", \"recompute\": {}, \"world\": {}, \"seq_len\": "
        "{}, \"rss_peak_mb_max\": {:.1f}, \"live_peak_mb_max\": {:.1f}, \"frozen_mb_per_rank_max\": {:.1f}, "
        "\"step_ms_max\": {:.0f}, \"loss\": {:.4f}}}\n",
        o.base, o.strategy, o.recompute, job.rt().world_size(), o.seq, f[0], f[1], f[2], f[3], loss_value);
  }
  return 0;
}

template <class Plan>
int with_strategy(const Plan& plan, const options& o, bench::counting_allocator& counted) {
  if (o.strategy == "ddp") return step(plan | loom::ddp(), o, counted);
  return step(plan | loom::fsdp(), o, counted);
}

template <class Plan>
int with_recompute(const Plan& plan, const options& o, bench::counting_allocator& counted) {
  if (o.recompute) return with_strategy(plan | loom::recompute(), o, counted);
  return with_strategy(plan, o, counted);
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{"One QLoRA step on one sequence a rank, and the memory it held (bench/qlora_memory runs it)"};
  app.add_option("--checkpoint", o.checkpoint, "a causal LM's Hugging Face folder")->required();
  app.add_option("--seq", o.seq, "tokens in each rank's sequence")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--strategy", o.strategy, "fsdp or ddp")->capture_default_str()->check(CLI::IsMember({"fsdp", "ddp"}));
  app.add_option("--base", o.base, "nf4: quantized(nf4); bf16: the base held in bf16")
      ->capture_default_str()
      ->check(CLI::IsMember({"nf4", "bf16"}));
  app.add_flag("--recompute", o.recompute, "recompute every decoder layer in backward");
  app.add_flag("--describe", o.describe, "print the job's describe() and its build's live tensor peak");
  CLI11_PARSE(app, argc, argv);
  try {
    bench::counting_allocator& counted = bench::counting_allocator::instance();
    c10::SetCPUAllocator(&counted, /*priority=*/100);
    torch::set_num_threads(1);
    const auto config = loom::models::causal_lm_config::from_pretrained(o.checkpoint);
    const auto base = loom::model<loom::models::CausalLM>(config) | loom::seeded(1234) |
                      loom::default_dtype(loom::bf16) | loom::pretrained(o.checkpoint);
    constexpr auto adapters =
        loom::lora(16, {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}, {.alpha = 32});
    constexpr auto bf16 = loom::mixed_precision({.param = loom::bf16, .reduce = loom::fp32});
    if (o.base == "nf4") return with_recompute(base | loom::quantized(loom::nf4) | adapters | bf16, o, counted);
    return with_recompute(base | adapters | bf16, o, counted);
  } catch (const std::exception& error) {
    fmt::print(stderr, "qlora-memory: {}\n", error.what());
    return 1;
  }
}

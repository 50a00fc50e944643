// The host memory a job needs to come up: a Llama (its config.json, and its weights unless
// --init seeded) built under a strategy (docs/benchmarks.md, "Memory while building"). Rank 0 prints
// one JSON line, each figure the largest over the ranks: the peak resident set (ru_maxrss) before
// build, once built and after a first forward; the peak of live tensor storage (every CPU allocation
// LibTorch makes, counted by a wrapping allocator) from the start until built and until after the
// forward; the model's bytes, its largest tensor and its largest unit (decoder layer); and the
// parameter bytes the rank holds once built.
//
// --construct whole builds a Llama whose constructor also draws from the generator, as a model of
// plain torch::nn layers does, so that fsdp() constructs it whole: the path every model took before
// construction without the full replica, measured beside it.
//
//   build/loom-run --nproc-per-node 2 -- build/bench/build-memory --checkpoint DIR --strategy fsdp
#include "counting_allocator.hpp"

#include <loom/loom.hpp>
#include <loom/models/causal_lm.hpp>

#include <c10/core/CPUAllocator.h>
#include <fmt/format.h>
#include <sys/resource.h>
#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <exception>
#include <string>

namespace {

constexpr double mib = 1024.0 * 1024.0;

double peak_rss_mb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // KiB on Linux
}

// A Llama that fsdp() cannot construct without its bytes: its constructor draws one number.
struct WholeLlama : loom::models::CausalLMImpl {
  explicit WholeLlama(const loom::models::causal_lm_config& config) : CausalLMImpl(config) { (void)torch::rand({1}); }
};

loom::models::CausalLMImpl& llama_of(loom::models::CausalLM& holder) { return *holder; }
loom::models::CausalLMImpl& llama_of(WholeLlama& module) { return module; }

double bytes_of(const torch::nn::Module& module) {
  double bytes = 0;
  for (const auto& parameter : module.parameters()) {
    bytes += static_cast<double>(parameter.numel()) * static_cast<double>(parameter.element_size());
  }
  return bytes;
}

template <class Plan>
int measure(const Plan& plan, const std::string& label, double before_mb, const bench::counting_allocator& counted) {
  auto job = loom::build(plan, loom::runtime::from_env());
  const loom::models::CausalLMImpl& llama = llama_of(job.module());
  const double model_bytes = bytes_of(llama);
  double largest = 0;
  for (const auto& parameter : llama.parameters()) {
    largest = std::max(largest, static_cast<double>(parameter.numel()) * static_cast<double>(parameter.element_size()));
  }
  double largest_unit = 0;
  for (const auto& layer : *llama.model->layers) largest_unit = std::max(largest_unit, bytes_of(*layer));
  double held = 0;  // what the optimizer steps: the rank's shards, or the replica
  for (const at::Tensor& t : job.trainable_parameters()) held += static_cast<double>(t.nbytes());
  const double built_mb = peak_rss_mb();
  const double built_live_mb = counted.peak_mb();
  const at::Tensor ids = torch::zeros({1, 8}, torch::kLong);
  {
    torch::NoGradGuard no_grad;
    (void)job.forward(ids);
  }
  at::Tensor mine =
      torch::tensor({before_mb, built_mb, peak_rss_mb(), built_live_mb, counted.peak_mb(), held / mib}, torch::kDouble);
  at::Tensor all = torch::empty({job.rt().world_size() * mine.numel()}, mine.options());
  job.rt().comm().all_gather(mine, all).wait();
  const at::Tensor largest_of_ranks = std::get<0>(all.view({job.rt().world_size(), -1}).max(0)).contiguous();
  if (job.rt().rank() == 0) {
    const auto* f = largest_of_ranks.data_ptr<double>();
    fmt::print(
        R"({{"run": "{}", "world": {}, "model_mb": {:.1f}, "largest_tensor_mb": {:.1f}, "largest_unit_mb": {:.1f}, )"
        R"("rss_before_build_mb": {:.1f}, "build_mb": {:.1f}, "build_live_mb": {:.1f}, )"
        R"("forward_mb": {:.1f}, "forward_live_mb": {:.1f}, "held_parameter_mb": {:.1f}}})"
        "\n",
        label, job.rt().world_size(), model_bytes / mib, largest / mib, largest_unit / mib, f[0], f[1] - f[0], f[3],
        f[2] - f[0], f[4], f[5]);
  }
  return 0;
}

template <class Model>
int run(const std::string& checkpoint, const std::string& strategy, bool pretrained, const std::string& label,
        double before_mb, const bench::counting_allocator& counted) {
  const auto config = loom::models::causal_lm_config::from_pretrained(checkpoint);
  const auto seeded = loom::model<Model>(config) | loom::seeded(0);
  const auto go = [&](const auto& plan) {
    if (strategy == "ddp") return measure(plan | loom::ddp(), label, before_mb, counted);
    if (strategy == "fsdp") return measure(plan | loom::fsdp(), label, before_mb, counted);
    return measure(plan | loom::local(), label, before_mb, counted);
  };
  return pretrained ? go(seeded | loom::pretrained(checkpoint)) : go(seeded);
}

}  // namespace

int main(int argc, char** argv) {
  std::string checkpoint;
  std::string strategy = "local";
  std::string init = "pretrained";
  std::string construct = "deferred";
  CLI::App app{"Peak host memory from start to the first step, building a Llama.", "build-memory"};
  app.add_option("--checkpoint", checkpoint, "a Hugging Face Llama folder")->required()->check(CLI::ExistingDirectory);
  app.add_option("--strategy", strategy, "local, ddp or fsdp")
      ->capture_default_str()
      ->check(CLI::IsMember({"local", "ddp", "fsdp"}));
  app.add_option("--init", init, "pretrained: the checkpoint's weights; seeded: seeded(0) from scratch")
      ->capture_default_str()
      ->check(CLI::IsMember({"pretrained", "seeded"}));
  app.add_option("--construct", construct,
                 "deferred: as loom builds a Llama; whole: a Llama whose constructor draws, built whole")
      ->capture_default_str()
      ->check(CLI::IsMember({"deferred", "whole"}));
  CLI11_PARSE(app, argc, argv);
  try {
    bench::counting_allocator& counted = bench::counting_allocator::instance();
    c10::SetCPUAllocator(&counted, /*priority=*/100);
    torch::set_num_threads(1);
    const double before_mb = peak_rss_mb();
    const bool pretrained = init == "pretrained";
    const std::string label = fmt::format("{} {} {}", strategy, init, construct);
    if (construct == "whole") return run<WholeLlama>(checkpoint, strategy, pretrained, label, before_mb, counted);
    return run<loom::models::CausalLM>(checkpoint, strategy, pretrained, label, before_mb, counted);
  } catch (const std::exception& error) {
    fmt::print(stderr, "build-memory: {}\n", error.what());
    return 1;
  }
}

// The host memory a job needs to come up: a Llama checkpoint loaded through pretrained(...) under a
// strategy, measured from the process's start to the first step (docs/benchmarks.md, "Memory while
// building"). Rank 0 prints one JSON line: the peak resident set (ru_maxrss) before build and after
// the first step, the model's bytes, the checkpoint's largest tensor, and the live parameter bytes
// on the rank; the largest over the ranks.
//
//   build/loom-run --nproc-per-node 2 -- build/bench/build-memory --checkpoint DIR --strategy fsdp
#include <loom/loom.hpp>
#include <loom/models/llama.hpp>

#include <fmt/format.h>
#include <sys/resource.h>
#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <exception>
#include <string>

namespace {

double peak_rss_mb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // KiB on Linux
}

constexpr double mib = 1024.0 * 1024.0;

template <class Plan>
int measure(const Plan& plan, const std::string& strategy, double before_mb) {
  auto job = loom::build(plan, loom::runtime::from_env());
  double model_bytes = 0;
  double largest = 0;
  for (const auto& parameter : job.module()->parameters()) {
    model_bytes += static_cast<double>(parameter.numel()) * static_cast<double>(parameter.element_size());
    largest = std::max(largest, static_cast<double>(parameter.numel()) * static_cast<double>(parameter.element_size()));
  }
  double live = 0;  // what the optimizer steps: the rank's shards, or the replica
  for (const at::Tensor& t : job.trainable_parameters()) live += static_cast<double>(t.nbytes());
  const at::Tensor ids = torch::zeros({1, 8}, torch::kLong);
  {
    torch::NoGradGuard no_grad;
    (void)job.forward(ids);
  }
  const double after_mb = peak_rss_mb();
  at::Tensor mine = torch::tensor({before_mb, after_mb, live / mib}, torch::kDouble);
  at::Tensor all = torch::empty({job.rt().world_size() * mine.numel()}, mine.options());
  job.rt().comm().all_gather(mine, all).wait();
  const at::Tensor largest_of_ranks = std::get<0>(all.view({job.rt().world_size(), -1}).max(0)).contiguous();
  if (job.rt().rank() == 0) {
    const auto* f = largest_of_ranks.data_ptr<double>();
    fmt::print(
        R"({{"strategy": "{}", "world": {}, "model_mb": {:.1f}, "largest_tensor_mb": {:.1f}, "rss_before_build_mb": {:.1f}, )"
        R"("rss_peak_mb": {:.1f}, "build_mb": {:.1f}, "live_parameter_mb": {:.1f}}})"
        "\n",
        strategy, job.rt().world_size(), model_bytes / mib, largest / mib, f[0], f[1], f[1] - f[0], f[2]);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string checkpoint;
  std::string strategy = "local";
  CLI::App app{"Peak host memory from start to the first step, building a Llama from a checkpoint.", "build-memory"};
  app.add_option("--checkpoint", checkpoint, "a Hugging Face Llama folder")->required()->check(CLI::ExistingDirectory);
  app.add_option("--strategy", strategy, "local, ddp or fsdp")
      ->capture_default_str()
      ->check(CLI::IsMember({"local", "ddp", "fsdp"}));
  CLI11_PARSE(app, argc, argv);
  try {
    torch::set_num_threads(1);
    const double before_mb = peak_rss_mb();
    const auto config = loom::models::llama_config::from_pretrained(checkpoint);
    const auto plan = loom::model<loom::models::Llama>(config) | loom::seeded(0) | loom::pretrained(checkpoint);
    if (strategy == "ddp") return measure(plan | loom::ddp(), strategy, before_mb);
    if (strategy == "fsdp") return measure(plan | loom::fsdp(), strategy, before_mb);
    return measure(plan | loom::local(), strategy, before_mb);
  } catch (const std::exception& error) {
    fmt::print(stderr, "build-memory: {}\n", error.what());
    return 1;
  }
}

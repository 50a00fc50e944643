// loom-bench: the workloads of ../shared/BENCHMARKS.md on loom. It does what the Python anchor does
// (../shared/bench/torch_anchor.py for the toy workloads, ../shared/bench/hf_anchor.py for the real
// models, from the checkpoint that one writes), step for step, and rank 0 prints one JSON line with
// the anchor's keys, so that bench/compare can pair the two, and one of its own: `step_ms_max`, the
// slowest step of any rank, warm-up included (tests/dist/load_check.py sets it against the timeout),
// and on CUDA `device_peak_mb`, rank 0's peak of allocated device memory.
//
//   build/loom-run --nproc-per-node 2 -- build/bench/loom-bench --workload gpt-lora-ddp --steps 30
//   build/loom-run --nproc-per-node 2 -- build/bench/loom-bench --workload llama-lora-bf16-fsdp --steps 10

#include "counting_allocator.hpp"
#include "statistics.hpp"

#include <common/command_line.hpp>
#include <loom/io/optimizer_state.hpp>
#include <loom/loom.hpp>
#include <loom/models/causal_lm.hpp>
#include <loom/models/wan.hpp>
#include <loom/optim/adamw.hpp>
#include <loom/runtime/failures.hpp>
#include <loom/runtime/host_reads.hpp>
#include <models/mlp.hpp>
#include <models/tiny_gpt.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <fmt/format.h>
#include <malloc.h>
#include <sys/resource.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace {

struct bench_options {
  std::string workload;
  int steps = 30;
  int warmup = 5;
  std::int64_t batch = 0;  // unset: the workload's own
  // AdamW's implementation: loom::optim::AdamW (fused), or torch::optim::AdamW (the per-parameter
  // loop LibTorch has), for the account of where the time goes. SGD is torch::optim's either way,
  // and the JSON line says so.
  std::string optimizer = "fused";
  // The steps by hand (the calls loom::train makes), each phase timed, for bench/phase_account.
  bool phases = false;
  // A Chrome trace of two steps after the warm-up (run by hand, as --phases runs them), for the
  // account of where a step's time goes by operator (bench/op_account).
  std::string trace;
  // The real models' starting weights: hf_anchor.py's checkpoint of the workload's family.
  std::string checkpoint = "/tmp/loom-hf-anchor/{family}";
};

constexpr std::array workloads{"mlp-ddp",
                               "gpt-local",
                               "gpt-ddp",
                               "gpt-lora-local",
                               "gpt-lora-ddp",
                               "gpt-fsdp",
                               "gpt-lora-fsdp",
                               "gpt-bf16-ddp",
                               "gpt-bf16-fsdp",
                               "gpt-lora-bf16-fsdp",
                               "gpt-long-fsdp",
                               "gpt-long-recompute-fsdp",
                               "gpt-lora-long-recompute-fsdp",
                               "gpt-hsdp",
                               "llama-fsdp",
                               "llama-lora-ddp",
                               "llama-lora-fsdp",
                               "llama-lora-bf16-fsdp",
                               "llama-lora-recompute-bf16-fsdp",
                               "llama-qlora-bf16-ddp",
                               "llama-qlora-bf16-fsdp",
                               "wan-fsdp",
                               "wan-lora-fsdp",
                               "wan-lora-bf16-fsdp",
                               "wan-fp8-lora-bf16-fsdp",
                               "long-wan-fsdp",
                               "long-wan-sp2-fsdp",
                               "long-wan-sp4-fsdp",
                               "long-llama-fsdp",
                               "long-llama-sp2-fsdp",
                               "long-llama-sp4-fsdp",
                               "long-wan-tp2-fsdp",
                               "long-wan-tp4-fsdp",
                               "long-llama-tp2-fsdp"};

// The options, or the exit code to end with (--help, a bad command line).
std::variant<bench_options, int> parse_options(int argc, char** argv) {
  bench_options options;
  CLI::App app{
      "The workloads of ../shared/BENCHMARKS.md on loom; rank 0 prints one JSON line with the keys of "
      "../shared/bench/torch_anchor.py.",
      "loom-bench"};
  app.add_option("--workload", options.workload, "one of BENCHMARKS.md's workloads")
      ->required()
      ->check(CLI::IsMember(std::vector<std::string>(workloads.begin(), workloads.end())));
  app.add_option("--steps", options.steps, "timed steps")->capture_default_str()->check(CLI::Range(1, 1'000'000));
  app.add_option("--warmup", options.warmup, "untimed steps before them")
      ->capture_default_str()
      ->check(CLI::Range(0, 1'000'000));
  app.add_option("--batch", options.batch, "the local batch (default: the workload's own)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  app.add_option("--optimizer", options.optimizer,
                 "AdamW's implementation: fused (loom::optim::AdamW) or torch (torch::optim::AdamW)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fused", "torch"}));
  app.add_option("--checkpoint", options.checkpoint,
                 "a real model's starting weights, as hf_anchor.py writes them ({family}: the workload's, e.g. wan)")
      ->capture_default_str();
  app.add_option("--trace", options.trace,
                 "write a Chrome trace of two steps after the warm-up, this rank's operators, to FILE.RANK.json "
                 "(bench/op_account sums it by operator)");
  app.add_flag("--phases", options.phases,
               "time each phase (forward, backward, optimizer, zero_grad) of steps run by hand, and print their "
               "medians instead (bench/phase_account)");
  if (const auto exit_code = recipes::parse_command_line(app, argc, argv)) return *exit_code;
  return options;
}

// Parameters (frozen ones too), their gradients and the optimizer's state: what the anchor counts,
// this rank's shards only (job.local_state_dict(), buffers included). Each live storage counts once. (The anchor also
// counts PyTorch's per-parameter 0-d `step` tensor, 4 bytes each, which LibTorch keeps as an integer.)
std::int64_t state_bytes(const loom::tensor_state& local, const std::vector<at::Tensor>& trainable,
                         const torch::optim::Optimizer& optimizer) {
  std::int64_t total = loom::optimizer_state_bytes(optimizer);
  std::set<const c10::StorageImpl*> seen;
  const auto count = [&](const at::Tensor& t) {
    if (t.defined() && seen.insert(t.storage().unsafeGetStorageImpl()).second) {
      total += static_cast<std::int64_t>(t.storage().nbytes());
    }
  };
  for (const loom::named_tensor& t : local) count(t.tensor);
  for (const at::Tensor& p : trainable) {
    count(p);
    count(p.grad());
  }
  return total;
}

// The frozen parameters' bytes this rank holds (its shards under fsdp): the base, quantized or not.
std::int64_t frozen_bytes(const loom::tensor_state& local, const torch::nn::Module& module) {
  std::set<std::string> trains;
  for (const auto& item : module.named_parameters()) {
    if (item.value().requires_grad()) trains.insert(item.key());
  }
  std::int64_t total = 0;
  for (const loom::named_tensor& t : local) {
    if (!trains.contains(t.name)) total += t.tensor.numel() * static_cast<std::int64_t>(t.tensor.element_size());
  }
  return total;
}

// What the C heap holds: on the CPU, LibTorch's allocator takes tensor storage from it, so the heap
// held between a forward and its backward is the activations' memory.
std::int64_t heap_in_use() {
  const struct mallinfo2 info = mallinfo2();
  return static_cast<std::int64_t>(info.uordblks + info.hblkhd);
}

// Every CPU tensor's storage, counted from main's first line.
bench::counting_allocator& live_tensors() { return bench::counting_allocator::instance(); }

double peak_rss_mb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

// A workload: `batch`, what a step consumes; draw(gen, size, device), one step's batch drawn as the
// anchor draws it; loss(job, batch); tokens_per_sample (0 where a sample is no sequence); the
// optimizer the anchor steps with, and the name of the implementation that ran.

// A batch drawn on the host, on the rank's device without a pageable copy (which would stop the host).
at::Tensor on_device(const at::Tensor& host, const at::Device& device) {
  return loom::to_device(host, device, host.scalar_type());
}

// Mlp, MSE to a random target, SGD.
struct mlp_workload {
  static constexpr std::int64_t default_batch = 32;
  static constexpr std::int64_t tokens_per_sample = 0;
  static constexpr std::int64_t width = 1024;
  using batch = std::pair<at::Tensor, at::Tensor>;

  static batch draw(const at::Generator& gen, std::int64_t size, const at::Device& device) {
    at::Tensor x = torch::randn({size, width}, gen);
    at::Tensor y = torch::randn({size, width}, gen);
    return {on_device(x, device), on_device(y, device)};
  }
  template <class Job>
  static at::Tensor loss(Job& job, const batch& b) {
    return torch::mse_loss(job.forward(b.first), b.second);
  }
  // loom has no SGD of its own: torch::optim's, whichever --optimizer asks for.
  static std::string_view implementation(std::string_view /*requested*/) { return "torch"; }
  static std::unique_ptr<torch::optim::Optimizer> optimizer(const std::vector<at::Tensor>& params, std::string_view) {
    return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(1e-3));
  }
};

// TinyGpt of context `Context`, next-token cross-entropy on random tokens, AdamW.
template <std::int64_t Context, std::int64_t Batch>
struct tiny_gpt_workload {
  static constexpr std::int64_t default_batch = Batch;
  static constexpr std::int64_t tokens_per_sample = Context;
  static constexpr models::tiny_gpt_config config{.ctx = Context};
  using batch = std::pair<at::Tensor, at::Tensor>;

  static batch draw(const at::Generator& gen, std::int64_t size, const at::Device& device) {
    at::Tensor x = torch::randint(0, config.vocab, {size, config.ctx}, gen, torch::kLong);
    at::Tensor y = torch::randint(0, config.vocab, {size, config.ctx}, gen, torch::kLong);
    return {on_device(x, device), on_device(y, device)};
  }
  template <class Job>
  static at::Tensor loss(Job& job, const batch& b) {
    return job.forward(b.first, b.second);
  }
  static std::string_view implementation(std::string_view requested) { return requested; }
  static std::unique_ptr<torch::optim::Optimizer> optimizer(const std::vector<at::Tensor>& params,
                                                            std::string_view implementation) {
    const auto options = torch::optim::AdamWOptions(3e-4);
    if (implementation == "torch") return std::make_unique<torch::optim::AdamW>(params, options);
    return std::make_unique<loom::optim::AdamW>(params, options);
  }
};
using gpt_workload = tiny_gpt_workload<128, 8>;
using gpt_long_workload = tiny_gpt_workload<512, 4>;  // the gpt-long-* workloads

// The wan-* workloads: hf_anchor.py's Wan DiT, one flow-matching step as it draws it (latents x0,
// noise, t = randint(0, 1000), text, in this order; s = t / 1000, the input (1 - s) x0 + s noise in
// the dtype the base is held in, the target the velocity noise - x0 in fp32), AdamW at its rates.
template <bool Adapted, c10::ScalarType InputDtype, std::int64_t Frames = 5, std::int64_t Side = 32>
struct wan_workload {
  static constexpr std::int64_t default_batch = 1;
  static constexpr std::array<std::int64_t, 4> latent_shape{16, Frames, Side, Side};  // channels, frames, height, width
  static constexpr std::array<std::int64_t, 2> text_shape{64, 128};                   // tokens, text_dim
  static constexpr std::int64_t tokens_per_sample =                                   // patched by (1, 2, 2)
      latent_shape[1] * (latent_shape[2] / 2) * (latent_shape[3] / 2);
  struct batch {
    at::Tensor noisy, timestep, text, velocity;
  };

  static batch draw(const at::Generator& gen, std::int64_t size, const at::Device& device) {
    const std::vector<std::int64_t> latents{size, latent_shape[0], latent_shape[1], latent_shape[2], latent_shape[3]};
    const at::Tensor x0 = torch::randn(latents, gen);
    const at::Tensor noise = torch::randn(latents, gen);
    const at::Tensor t = torch::randint(0, 1000, {size}, gen, torch::kLong);
    const at::Tensor text = torch::randn({size, text_shape[0], text_shape[1]}, gen);
    const at::Tensor s = (t.to(torch::kFloat) / 1000.0).view({-1, 1, 1, 1, 1});
    const at::Tensor noisy = ((1 - s) * x0 + s * noise).to(InputDtype);
    return {on_device(noisy, device), on_device(t, device), on_device(text.to(InputDtype), device),
            on_device(noise - x0, device)};
  }
  template <class Job>
  static at::Tensor loss(Job& job, const batch& b) {
    return torch::mse_loss(job.forward(b.noisy, b.timestep, b.text).to(torch::kFloat), b.velocity);
  }
  static std::string_view implementation(std::string_view requested) { return requested; }
  static std::unique_ptr<torch::optim::Optimizer> optimizer(const std::vector<at::Tensor>& params,
                                                            std::string_view implementation) {
    const auto options = torch::optim::AdamWOptions(Adapted ? 1e-3 : 1e-4);
    if (implementation == "torch") return std::make_unique<torch::optim::AdamW>(params, options);
    return std::make_unique<loom::optim::AdamW>(params, options);
  }
};

// The long-wan-* workloads (docs/benchmarks.md, "Sequence parallelism" and "Tensor parallelism"): the
// wan-* step on clips of 8 frames of 64 × 64 latents, 8192 tokens, a Wan of 2 blocks built here.
using long_wan_workload = wan_workload<false, torch::kFloat, 8, 64>;

// A causal language model's step on `Batch` sequences of `Tokens` random ids below `Vocab` (labels = ids:
// transformers' causal-LM loss, shifted, a mean over the tokens in fp32; over the sequence group under
// sequence_parallel), computed by the model's forward(ids, labels) over chunks of tokens, never every
// token's logits at once (CausalLM::loss_chunk_tokens), AdamW at hf_anchor.py's rates (1e-3 for
// adapters, 1e-4 otherwise).
template <std::int64_t Batch, std::int64_t Tokens, std::int64_t Vocab, bool Adapted>
struct causal_lm_workload {
  static constexpr std::int64_t default_batch = Batch;
  static constexpr std::int64_t tokens_per_sample = Tokens;
  static constexpr std::int64_t vocab = Vocab;
  struct batch {
    at::Tensor ids;
  };
  static batch draw(const at::Generator& gen, std::int64_t size, const at::Device& device) {
    return {on_device(torch::randint(vocab, {size, tokens_per_sample}, gen, torch::kLong), device)};
  }
  template <class Job>
  static at::Tensor loss(Job& job, const batch& b) {
    return job.forward(b.ids, b.ids);
  }
  static std::string_view implementation(std::string_view requested) { return requested; }
  static std::unique_ptr<torch::optim::Optimizer> optimizer(const std::vector<at::Tensor>& params,
                                                            std::string_view implementation) {
    const auto options = torch::optim::AdamWOptions(Adapted ? 1e-3 : 1e-4);
    if (implementation == "torch") return std::make_unique<torch::optim::AdamW>(params, options);
    return std::make_unique<loom::optim::AdamW>(params, options);
  }
};

// The llama-* workloads: hf_anchor.py's Llama 3 shape from its checkpoint, ids = randint(0, 4096, (4, 256)).
template <bool Adapted>
using llama_workload = causal_lm_workload<4, 256, 4096, Adapted>;

// The long-llama-* workloads: a Llama of 2 layers (4 heads of 32, 2 key-value heads) on one sequence
// of 8192 random tokens.
struct long_llama_workload : causal_lm_workload<1, 8192, 256, false> {
  static loom::models::causal_lm_config config() {
    loom::models::causal_lm_config c;
    c.vocab_size = vocab;
    c.hidden_size = 128;
    c.intermediate_size = 256;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 32;
    c.max_position_embeddings = tokens_per_sample;
    return c;
  }
};

// One rank's figures, in the order they travel in the all-gather.
struct rank_figures {
  double step_ms_median;
  double state_bytes;
  double rss_peak_mb;
  double step_ms_max;    // every step, warm-up included
  double activation_mb;  // the heap a step holds between forward and backward, median over the counted steps
  double live_peak_mb;   // the peak of live CPU tensor bytes over the whole run, build included (counted exactly)
  double frozen_mb;      // the frozen parameters' bytes this rank holds
};

std::vector<rank_figures> gather_figures(const loom::runtime& rt, const rank_figures& mine) {
  constexpr std::int64_t fields = 7;
  at::Tensor shard = torch::tensor({mine.step_ms_median, mine.state_bytes, mine.rss_peak_mb, mine.step_ms_max,
                                    mine.activation_mb, mine.live_peak_mb, mine.frozen_mb},
                                   torch::kDouble)
                         .to(rt.device());
  at::Tensor flat = torch::empty({rt.world_size() * fields}, shard.options());
  try {
    rt.comm().all_gather(shard, flat).wait();
  } catch (...) {
    loom::rethrow_as_job_failure(rt, std::current_exception(), "gathering the figures");
  }
  flat = flat.cpu();
  std::vector<rank_figures> all;
  const auto* values = flat.const_data_ptr<double>();
  for (int r = 0; r < rt.world_size(); ++r) {
    all.push_back({values[r * fields], values[r * fields + 1], values[r * fields + 2], values[r * fields + 3],
                   values[r * fields + 4], values[r * fields + 5], values[r * fields + 6]});
  }
  return all;
}

template <class Field>
double max_over_ranks(const std::vector<rank_figures>& all, Field field) {
  double worst = all.front().*field;
  for (const rank_figures& f : all) worst = std::max(worst, f.*field);
  return worst;
}

struct run_result {
  rank_figures figures;
  double final_loss;
  std::int64_t trainable_params;
  std::int64_t local_batch;
  std::int64_t tokens_per_sample;  // 0: no sequence, no tokens/s
  std::string_view optimizer;      // the implementation that ran
  int data_ranks;                  // the ranks that read batches of their own (world / k under sequence_parallel(k)
                                   // or tensor_parallel(k))
};

// Where samples are sequences, their length and the tokens every rank steps through per second of the
// slowest rank's median step (the anchor's `seq_len` and `tokens_per_s`); nothing otherwise.
std::string token_fields(const run_result& result, double step_ms) {
  if (result.tokens_per_sample == 0) return {};
  const double tokens = static_cast<double>(result.data_ranks * result.local_batch * result.tokens_per_sample);
  return fmt::format(", \"seq_len\": {}, \"tokens_per_s\": {:.1f}", result.tokens_per_sample,
                     tokens / (step_ms / 1000.0));
}

// On CUDA, this rank's peak of allocated device memory (the caching allocator's statistics, as
// torch.cuda.max_memory_allocated), as one more key; nothing on the CPU.
std::string device_peak_field(const loom::runtime& rt) {
  if (!rt.device().is_cuda()) return {};
  const auto stats = c10::getDeviceAllocator(c10::kCUDA)->getDeviceStats(rt.device().index());
  const auto aggregate = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  return fmt::format(", \"device_peak_mb\": {:.1f}",
                     static_cast<double>(stats.allocated_bytes[aggregate].peak) / (1 << 20));
}

void print_json(const bench_options& options, const loom::runtime& rt, const run_result& result,
                const std::vector<rank_figures>& all) {
  const double step_ms = max_over_ranks(all, &rank_figures::step_ms_median);
  fmt::print(
      "{{\"impl\": \"loom\", \"torch\": \"{}\", \"workload\": \"{}\", \"world\": {}, \"local_batch\": {}, "
      "\"optimizer\": \"{}\", \"steps\": {}, \"step_ms_median\": {:.3f}{}, \"state_mb_per_rank_max\": {:.3f}, "
      "\"rss_peak_mb_max\": {:.1f}, "
      "\"final_loss\": {:.5f}, \"trainable_params\": {}, \"step_ms_max\": {:.3f}, \"activation_mb_max\": {:.1f}, "
      "\"live_peak_mb_max\": {:.1f}, \"frozen_mb_per_rank_max\": {:.3f}{}}}\n",
      TORCH_VERSION, options.workload, rt.world_size(), result.local_batch, result.optimizer, options.steps, step_ms,
      token_fields(result, step_ms), max_over_ranks(all, &rank_figures::state_bytes) / (1 << 20),
      max_over_ranks(all, &rank_figures::rss_peak_mb), result.final_loss, result.trainable_params,
      max_over_ranks(all, &rank_figures::step_ms_max), max_over_ranks(all, &rank_figures::activation_mb),
      max_over_ranks(all, &rank_figures::live_peak_mb), max_over_ranks(all, &rank_figures::frozen_mb),
      device_peak_field(rt));
  std::fflush(stdout);
}

template <class Workload>
std::int64_t local_batch(const bench_options& options) {
  return options.batch ? options.batch : Workload::default_batch;
}

// Every step's batch, warm-up included, drawn before the steps from the anchor's generator (one per
// data-parallel rank: the ranks of a sequence or tensor-parallel group draw the same).
template <class Workload, class Job>
std::vector<typename Workload::batch> draw_batches(const Job& job, const bench_options& options) {
  const at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(99 + job.data_rank());
  std::vector<typename Workload::batch> batches;
  for (int step = 0; step < options.warmup + options.steps; ++step) {
    batches.push_back(Workload::draw(gen, local_batch<Workload>(options), job.rt().device()));
  }
  return batches;
}

// The torch::nn::Module of a model: a TORCH_MODULE holder's contained module, or the model itself.
template <class M>
const torch::nn::Module& torch_module(const M& model) {
  if constexpr (requires { model.ptr(); }) {
    return *model.ptr();
  } else {
    return model;
  }
}

// A step is forward, backward, optimizer step and zero_grad (gradients kept, as the anchor's
// set_to_none=False), run by loom::train with no run folder.
template <class Workload, class Job>
run_result train(Job& job, const bench_options& options) {
  const std::vector<at::Tensor> params = job.trainable_parameters();
  const auto optimizer = Workload::optimizer(params, options.optimizer);
  const auto batches = draw_batches<Workload>(job, options);

  std::vector<double> step_ms;
  std::vector<double> activation_mb;
  double slowest_ms = 0;
  double final_loss = 0;
  loom::train(job, *optimizer,
              {.loss =
                   [&](std::int64_t step, int) {
                     const std::int64_t before = heap_in_use();
                     at::Tensor loss = Workload::loss(job, batches[static_cast<std::size_t>(step - 1)]);
                     if (step > options.warmup)
                       activation_mb.push_back(static_cast<double>(heap_in_use() - before) / (1 << 20));
                     return loss;
                   },
               .on_step =
                   [&](const loom::step_report& report) {
                     final_loss = report.rank_loss;  // rank 0's prints, as the anchor's
                     slowest_ms = std::max(slowest_ms, report.step_ms);
                     if (report.step > options.warmup) step_ms.push_back(report.step_ms);
                   }},
              {.steps = options.warmup + options.steps,
               .log_every = options.warmup + options.steps,
               .log_seconds = std::numeric_limits<double>::infinity(),
               .name = options.workload,
               .set_to_none = false});

  std::int64_t trainable = 0;  // the model's, as the anchor counts them (not this rank's shards)
  for (const at::Tensor& p : torch_module(job.module()).parameters()) trainable += p.requires_grad() ? p.numel() : 0;
  const rank_figures figures{
      bench::median(step_ms),
      static_cast<double>(state_bytes(job.local_state_dict(), params, *optimizer)),
      peak_rss_mb(),
      slowest_ms,
      bench::median(activation_mb),
      live_tensors().peak_mb(),
      static_cast<double>(frozen_bytes(job.local_state_dict(), torch_module(job.module()))) / (1 << 20)};
  return {figures,
          final_loss,
          trainable,
          local_batch<Workload>(options),
          Workload::tokens_per_sample,
          Workload::implementation(options.optimizer),
          job.data_world_size()};
}

// The calls loom::train makes for a step, by hand, each timed: forward (the loss), backward, the
// optimizer's step, zero_grad (in place, as the anchor's set_to_none=False). Rank 0 prints each
// phase's median over the counted steps, its own.
template <class Workload, class Job>
void time_phases(Job& job, const bench_options& options) {
  const auto optimizer = Workload::optimizer(job.trainable_parameters(), options.optimizer);
  const auto batches = draw_batches<Workload>(job, options);
  constexpr std::array<std::string_view, 4> names{"forward", "backward", "optimizer", "zero_grad"};
  std::array<std::vector<double>, names.size()> phase_ms;
  for (int step = 0; step < options.warmup + options.steps; ++step) {
    using clock = std::chrono::steady_clock;
    std::array<clock::time_point, names.size() + 1> marks;
    marks[0] = clock::now();
    const at::Tensor loss = Workload::loss(job, batches[static_cast<std::size_t>(step)]);
    marks[1] = clock::now();
    job.backward(loss);
    marks[2] = clock::now();
    optimizer->step();
    marks[3] = clock::now();
    job.zero_grad(/*set_to_none=*/false);
    marks[4] = clock::now();
    if (step < options.warmup) continue;
    for (std::size_t p = 0; p < names.size(); ++p) {
      phase_ms[p].push_back(std::chrono::duration<double, std::milli>(marks[p + 1] - marks[p]).count());
    }
  }
  if (job.rt().rank() != 0) return;
  std::string fields;
  for (std::size_t p = 0; p < names.size(); ++p) {
    fields += fmt::format("{}\"{}\": {:.3f}", p ? ", " : "", names[p], bench::median(phase_ms[p]));
  }
  fmt::print("{{\"impl\": \"loom\", \"workload\": \"{}\", \"optimizer\": \"{}\", \"phase_ms_median\": {{{}}}}}\n",
             options.workload, Workload::implementation(options.optimizer), fields);
  std::fflush(stdout);
}

// The warm-up steps by hand, then two under LibTorch's profiler (its CPU operators), saved as a
// Chrome trace: FILE.RANK.json.
template <class Workload, class Job>
void trace_steps(Job& job, const bench_options& options) {
  namespace profiler = torch::autograd::profiler;
  const auto optimizer = Workload::optimizer(job.trainable_parameters(), options.optimizer);
  const auto batches = draw_batches<Workload>(job, options);
  const auto step = [&](int number) {
    job.backward(Workload::loss(job, batches[static_cast<std::size_t>(number) % batches.size()]));
    optimizer->step();
    job.zero_grad(/*set_to_none=*/false);
  };
  for (int number = 0; number < options.warmup; ++number) step(number);
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  const std::set<torch::profiler::impl::ActivityType> activities{torch::profiler::impl::ActivityType::CPU};
  profiler::prepareProfiler(config, activities);
  profiler::enableProfiler(config, activities);
  step(options.warmup);
  step(options.warmup + 1);
  profiler::disableProfiler()->save(fmt::format("{}.{}.json", options.trace, job.rt().rank()));
}

template <class Workload, class Plan>
void run(const Plan& plan, const bench_options& options) {
  auto job = loom::build(plan, loom::runtime::from_env());
  if (!options.trace.empty()) return trace_steps<Workload>(job, options);
  if (options.phases) return time_phases<Workload>(job, options);
  const run_result result = train<Workload>(job, options);
  const std::vector<rank_figures> all = gather_figures(job.rt(), result.figures);
  if (job.rt().rank() == 0) print_json(options, job.rt(), result, all);
}

// hf_anchor.py's checkpoint of `family` (its --checkpoint pattern filled in), or a sentence saying how
// to write it.
std::filesystem::path anchor_checkpoint(const bench_options& options, std::string_view family) {
  std::string path = options.checkpoint;
  if (const auto at = path.find("{family}"); at != std::string::npos) path.replace(at, 8, family);
  if (!std::filesystem::exists(std::filesystem::path(path) / "config.json")) {
    throw std::invalid_argument(
        fmt::format("{} has no starting weights ({}/config.json is missing): write them with "
                    "`python3 ../shared/bench/hf_anchor.py --make-checkpoint {} --family {}`, or give --checkpoint",
                    options.workload, path, path, family));
  }
  return path;
}

// The Wan DiT from the anchor's checkpoint, each block a shard unit; LoRA r 16, alpha 16 on FastVideo's
// targets (to_out is diffusers' to_out.0); bf16: the base held in bf16 (the anchor's
// from_pretrained(torch_dtype=bfloat16), which keeps diffusers' fp32 modules), gathered in bf16 and
// reduced in fp32.
void run_wan_workload(const bench_options& options) {
  const std::filesystem::path checkpoint = anchor_checkpoint(options, "wan");
  const auto wan =
      loom::model<loom::models::Wan>(loom::models::wan_config::from_pretrained(checkpoint)) | loom::seeded(1234);
  const auto weights = loom::pretrained(checkpoint.string());
  constexpr auto adapters = loom::lora(16, {"to_q", "to_k", "to_v", "to_out.0"}, {.alpha = 16});
  const std::string_view name = options.workload;
  if (name == "wan-fsdp") return run<wan_workload<false, torch::kFloat>>(wan | weights | loom::fsdp(), options);
  if (name == "wan-lora-fsdp") {
    return run<wan_workload<true, torch::kFloat>>(wan | weights | adapters | loom::fsdp(), options);
  }
  if (name == "wan-lora-bf16-fsdp") {
    constexpr auto bf16 = loom::mixed_precision({.param = loom::bf16, .reduce = loom::fp32});
    return run<wan_workload<true, torch::kBFloat16>>(
        wan | loom::default_dtype(loom::bf16) | weights | adapters | bf16 | loom::fsdp(), options);
  }
  // The same over a base held in fp8 (e4m3, a scale per row), as diffusion-pipe trains Wan 14B in 24 GB.
  if (name == "wan-fp8-lora-bf16-fsdp") {
    constexpr auto bf16 = loom::mixed_precision({.param = loom::bf16, .reduce = loom::fp32});
    return run<wan_workload<true, torch::kBFloat16>>(
        wan | loom::default_dtype(loom::bf16) | weights | loom::quantized(loom::fp8) | adapters | bf16 | loom::fsdp(),
        options);
  }
  throw std::logic_error(fmt::format("workload '{}' has no plan", name));
}

// The Llama from the anchor's checkpoint, each decoder layer a shard unit; LoRA r 16, alpha 32 on every
// projection of attention and MLP; bf16: the base held in bf16 (the anchor's from_pretrained(torch_dtype=
// bfloat16)), gathered in bf16 and reduced in fp32; recompute: every decoder layer recomputed in backward.
void run_llama_workload(const bench_options& options) {
  const std::filesystem::path checkpoint = anchor_checkpoint(options, "llama");
  const auto llama = loom::model<loom::models::CausalLM>(loom::models::causal_lm_config::from_pretrained(checkpoint)) |
                     loom::seeded(1234);
  const auto weights = loom::pretrained(checkpoint.string());
  constexpr auto adapters =
      loom::lora(16, {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}, {.alpha = 32});
  constexpr auto bf16 = loom::mixed_precision({.param = loom::bf16, .reduce = loom::fp32});
  const std::string_view name = options.workload;
  if (name == "llama-fsdp") return run<llama_workload<false>>(llama | weights | loom::fsdp(), options);
  if (name == "llama-lora-ddp") return run<llama_workload<true>>(llama | weights | adapters | loom::ddp(), options);
  if (name == "llama-lora-fsdp") return run<llama_workload<true>>(llama | weights | adapters | loom::fsdp(), options);
  const auto bf16_base = llama | loom::default_dtype(loom::bf16) | weights | adapters | bf16;
  if (name == "llama-lora-bf16-fsdp") return run<llama_workload<true>>(bf16_base | loom::fsdp(), options);
  if (name == "llama-lora-recompute-bf16-fsdp") {
    return run<llama_workload<true>>(bf16_base | loom::recompute() | loom::fsdp(), options);
  }
  // QLoRA as PEFT's guide sets it up: the base in bitsandbytes' nf4 with double quantization, computing in bf16.
  const auto qlora = llama | loom::default_dtype(loom::bf16) | weights | loom::quantized(loom::nf4) | adapters | bf16;
  if (name == "llama-qlora-bf16-ddp") return run<llama_workload<true>>(qlora | loom::ddp(), options);
  if (name == "llama-qlora-bf16-fsdp") return run<llama_workload<true>>(qlora | loom::fsdp(), options);
  throw std::logic_error(fmt::format("workload '{}' has no plan", name));
}

// The size of the split a long-* workload's name asks for ("-sp2-": 2 for `kind` "sp"), 1 for none.
std::size_t split_size(std::string_view name, std::string_view kind) {
  for (const std::size_t size : {2, 4}) {
    if (name.find(fmt::format("-{}{}-", kind, size)) != std::string_view::npos) return size;
  }
  return 1;
}

// The long-* workloads, built here with seeded(1234), fsdp() over every rank, with and without
// sequence_parallel(k) or tensor_parallel(k): at 4 ranks, sp2 and tp2 are 2 groups × 2 data-parallel
// ranks, sp4 and tp4 one group of 4. The unsplit long-*-fsdp has neither stage. The long Llama has
// 2 key-value heads, which tensor_parallel(4) refuses to split, so it has no tp4.
void run_long_workload(const bench_options& options) {
  const std::string_view name = options.workload;
  const auto run_split = [&](const auto& split) {
    if (name.starts_with("long-wan-")) {
      loom::models::wan_config config;
      config.num_attention_heads = 4;
      config.attention_head_dim = 32;
      config.text_dim = 128;
      config.freq_dim = 64;
      config.ffn_dim = 512;
      config.num_layers = 2;
      return run<long_wan_workload>(loom::model<loom::models::Wan>(config) | loom::seeded(1234) | split | loom::fsdp(),
                                    options);
    }
    return run<long_llama_workload>(
        loom::model<loom::models::CausalLM>(long_llama_workload::config()) | loom::seeded(1234) | split | loom::fsdp(),
        options);
  };
  if (const std::size_t tensor = split_size(name, "tp"); tensor > 1) {
    return run_split(loom::tensor_parallel_stage::checked({.size = tensor}));
  }
  return run_split(loom::sequence_parallel_stage::checked({.size = split_size(name, "sp")}));
}

// Plans are typed, so each workload is its own plan expression.
void run_workload(const bench_options& options) {
  const auto gpt = loom::model<models::TinyGpt>(gpt_workload::config) | loom::seeded(1234);
  const auto adapters = loom::lora(8, {"q_proj", "k_proj", "v_proj", "o_proj"});
  const std::string_view name = options.workload;
  if (name == "mlp-ddp")
    return run<mlp_workload>(loom::model<models::Mlp>() | loom::seeded(1234) | loom::ddp(), options);
  if (name == "gpt-local") return run<gpt_workload>(gpt | loom::local(), options);
  if (name == "gpt-ddp") return run<gpt_workload>(gpt | loom::ddp(), options);
  if (name == "gpt-lora-local") return run<gpt_workload>(gpt | adapters | loom::local(), options);
  if (name == "gpt-lora-ddp") return run<gpt_workload>(gpt | adapters | loom::ddp(), options);
  if (name == "gpt-fsdp") return run<gpt_workload>(gpt | loom::fsdp(), options);
  if (name == "gpt-lora-fsdp") return run<gpt_workload>(gpt | adapters | loom::fsdp(), options);
  // fp32 parameters, the forward under autocast(bf16); fp32 shards gathered in bf16, reduced in fp32.
  constexpr auto bf16 = loom::mixed_precision({.param = loom::bf16, .reduce = loom::fp32});
  if (name == "gpt-bf16-ddp") return run<gpt_workload>(gpt | bf16 | loom::ddp(), options);
  if (name == "gpt-bf16-fsdp") return run<gpt_workload>(gpt | bf16 | loom::fsdp(), options);
  if (name == "gpt-lora-bf16-fsdp") {
    // The frozen base held in bf16 (the anchor's model.to(bfloat16)), the adapters in fp32.
    return run<gpt_workload>(gpt | loom::default_dtype(loom::bf16) | adapters | bf16 | loom::fsdp(), options);
  }
  // A context of 512; every block recomputed in backward (the anchor's checkpoint_wrapper on each).
  const auto gpt_long = loom::model<models::TinyGpt>(gpt_long_workload::config) | loom::seeded(1234);
  if (name == "gpt-long-fsdp") return run<gpt_long_workload>(gpt_long | loom::fsdp(), options);
  if (name == "gpt-long-recompute-fsdp") {
    return run<gpt_long_workload>(gpt_long | loom::recompute() | loom::fsdp(), options);
  }
  if (name == "gpt-lora-long-recompute-fsdp") {
    return run<gpt_long_workload>(gpt_long | adapters | loom::recompute() | loom::fsdp(), options);
  }
  // 4 ranks: sharded within pairs (0, 1) and (2, 3), replicated across them (the anchor's 2 × 2 mesh).
  if (name == "gpt-hsdp") return run<gpt_workload>(gpt | loom::fsdp({.shard_group_size = 2}), options);
  if (name.starts_with("llama-")) return run_llama_workload(options);
  if (name.starts_with("wan-")) return run_wan_workload(options);
  if (name.starts_with("long-")) return run_long_workload(options);
  throw std::logic_error(fmt::format("workload '{}' has no plan", name));  // --workload's check lists them
}

}  // namespace

int main(int argc, char** argv) {
  const auto parsed = parse_options(argc, argv);
  if (const int* exit_code = std::get_if<int>(&parsed)) return *exit_code;
  c10::SetCPUAllocator(&live_tensors(), /*priority=*/100);
  torch::set_num_threads(1);  // one intra-op thread per rank, as the anchor
  try {
    run_workload(std::get<bench_options>(parsed));
  } catch (const std::exception& error) {
    fmt::print(stderr, "loom-bench: {}\n", error.what());
    return 1;
  }
  return 0;
}

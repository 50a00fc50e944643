// loom's CausalLM on a transformers checkpoint of any family it reads
// (tests/models/causal_lm_vs_transformers.py makes them and checks what this writes):
//   causal-lm-parity FOLDER {local|ddp|fsdp} [--bf16] [--lora OUT]
// reads FOLDER/config.json and builds the plan with pretrained(FOLDER) (the weights by name,
// strictly), under mixed_precision() with --bf16. Without --lora it runs the forward on
// FOLDER/expected.safetensors' ids and compares its logits with transformers' on every rank: fp32
// within 1e-5 of the largest logit; bf16 against transformers' fp32 logits, their rms difference at
// most bf16_margin times that of transformers' own model computing in bf16.
// With --lora it fine-tunes lora(4, {q_proj, v_proj, down_proj}) for a few AdamW steps, each rank on
// ids of its own, and writes what transformers and PEFT must reproduce: OUT/adapter (save_adapter),
// OUT/merged (save_weights after merge(), with FOLDER's config.json) and OUT/logits.safetensors
// (the ids and the trained model's logits for them); the merged model's logits must equal the
// unmerged ones here first (in fp32).
#include "named_tensor.hpp"

#include <loom/io/safetensors.hpp>
#include <loom/loom.hpp>
#include <loom/models/causal_lm.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/optim/adamw.h>
#include <torch/torch.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <optional>
#include <string_view>
#include <vector>

namespace {

using loom::testing::named;

namespace fs = std::filesystem;

constexpr double fp32_tolerance = 1e-5;
// bf16 keeps 8 significant bits, and three layers of matmuls, norms and softmaxes compound their
// rounding: what is close enough is measured on transformers' own model in bf16, on the same ids.
constexpr double bf16_margin = 2;
constexpr int lora_steps = 3;

struct arguments {
  fs::path folder;
  std::string_view strategy;
  bool bf16 = false;
  std::optional<fs::path> lora_out;
};

at::Tensor logits_of(auto& job, const at::Tensor& ids) {
  torch::NoGradGuard no_grad;
  return job.forward(ids).to(at::kFloat);
}

double largest_difference(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }
// bf16's errors are compared by their root mean square: the largest of a few thousand rounding
// errors is one sample of a wide tail, the mean square of them is stable from one model to the next.
double rms_difference(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).square().mean().sqrt().item<double>();
}

// describe()'s line of what pretrained(...) read on this rank (the driver checks that under fsdp() a
// rank reads its share of the checkpoint, under the others all of it).
void print_bytes_read(auto& job) {
  const std::string described = job.describe();
  const auto begin = described.find("weights from");
  fmt::print("rank {}: {}\n", job.rt().rank(), described.substr(begin, described.find('\n', begin) - begin));
}

bool compare(auto& job, const arguments& args) {
  print_bytes_read(job);
  const std::vector<loom::named_tensor> expected = loom::load_safetensors(args.folder / "expected.safetensors").tensors;
  const at::Tensor reference = named(expected, "logits");
  const at::Tensor logits = logits_of(job, named(expected, "ids"));
  const double scale = reference.abs().max().item<double>();
  const auto measure = args.bf16 ? rms_difference : largest_difference;
  const double difference = measure(logits, reference);
  const double allowed =
      args.bf16 ? bf16_margin * measure(named(expected, "logits_bf16"), reference) : fp32_tolerance * scale;
  const bool within = logits.sizes() == reference.sizes() && difference <= allowed;
  fmt::print(
      "rank {}: {} {}{}: logits {} against transformers' {}, {} difference {:.2e} (largest logit {:.2e}): {} "
      "{:.2e}{}\n",
      job.rt().rank(), args.folder.filename().string(), args.strategy, args.bf16 ? " bf16" : "",
      fmt::join(logits.sizes(), "x"), fmt::join(reference.sizes(), "x"), args.bf16 ? "rms" : "largest", difference,
      scale, within ? "within" : "BEYOND", allowed,
      args.bf16 ? fmt::format(" ({} x transformers' own in bf16)", bf16_margin) : "");
  return within;
}

at::Tensor token_ids(std::uint64_t seed, std::int64_t vocab) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  return torch::randint(0, vocab, {2, 20}, generator, torch::kLong);
}

bool fine_tune(auto& job, const arguments& args) {
  const fs::path& out = *args.lora_out;
  const std::int64_t vocab = job.module()->config.vocab_size;
  torch::optim::AdamW optimizer(job.trainable_parameters(), torch::optim::AdamWOptions(5e-2));
  for (int step = 0; step < lora_steps; ++step) {
    const at::Tensor ids = token_ids(1000 * static_cast<std::uint64_t>(step) + job.rt().rank(), vocab);
    job.backward(loom::models::causal_lm_loss(job.forward(ids), ids));
    optimizer.step();
    job.zero_grad();
  }
  const at::Tensor ids = token_ids(99, vocab);
  const at::Tensor trained = logits_of(job, ids);
  job.save_adapter(out / "adapter");
  if (job.rt().rank() == 0) loom::save_safetensors(out / "logits.safetensors", {{"ids", ids}, {"logits", trained}});
  job.merge();
  const at::Tensor merged = logits_of(job, ids);
  job.save_weights(out / "merged");
  if (job.rt().rank() == 0) fs::copy_file(args.folder / "config.json", out / "merged" / "config.json");
  // In bf16 the merged model rounds W + BA where the unmerged one rounds W and the adapters' path
  // apart: two roundings as far from each other as from fp32, which the driver checks against
  // transformers on the merged weights. Here only fp32's equality is checked.
  const double difference = largest_difference(merged, trained);
  const double allowed = fp32_tolerance * trained.abs().max().item<double>();
  const bool within = args.bf16 || difference <= allowed;
  fmt::print("rank {}: {} {}{} lora: merged logits against unmerged, largest difference {:.2e}: {}\n", job.rt().rank(),
             args.folder.filename().string(), args.strategy, args.bf16 ? " bf16" : "", difference,
             args.bf16 ? "bf16, checked against transformers"
             : within  ? "within 1e-5"
                       : "BEYOND 1e-5");
  return within;
}

template <class Plan>
bool run(const Plan& plan, const arguments& args) {
  auto job = loom::build(plan, loom::runtime::from_env());
  return args.lora_out ? fine_tune(job, args) : compare(job, args);
}

template <class Plan>
bool with_strategy(const Plan& plan, const arguments& args) {
  if (args.strategy == "local") return run(plan | loom::local(), args);
  if (args.strategy == "ddp") return run(plan | loom::ddp(), args);
  if (args.strategy == "fsdp") return run(plan | loom::fsdp(), args);
  throw std::invalid_argument(fmt::format("unknown strategy '{}': local, ddp or fsdp", args.strategy));
}

template <class Plan>
bool with_precision(const Plan& plan, const arguments& args) {
  return args.bf16 ? with_strategy(plan | loom::mixed_precision(), args) : with_strategy(plan, args);
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string_view> words(argv + 1, argv + argc);
  if (words.size() < 2) {
    fmt::print(stderr, "usage: causal-lm-parity FOLDER {{local|ddp|fsdp}} [--bf16] [--lora OUT]\n");
    return 2;
  }
  arguments args;
  args.folder = words[0];
  args.strategy = words[1];
  for (std::size_t i = 2; i < words.size(); ++i) {
    if (words[i] == "--bf16") {
      args.bf16 = true;
    } else if (words[i] == "--lora" && i + 1 < words.size()) {
      args.lora_out = fs::path(words[++i]);
    } else {
      fmt::print(stderr, "causal-lm-parity: unexpected '{}'\n", words[i]);
      return 2;
    }
  }
  try {
    const auto config = loom::models::causal_lm_config::from_pretrained(args.folder);
    const auto base =
        loom::model<loom::models::CausalLM>(config) | loom::seeded(0) | loom::pretrained(args.folder.string());
    const bool ok = args.lora_out ? with_precision(base | loom::lora(4, {"q_proj", "v_proj", "down_proj"}), args)
                                  : with_precision(base, args);
    return ok ? 0 : 1;
  } catch (const std::exception& error) {
    fmt::print(stderr, "causal-lm-parity: {}\n", error.what());
    return 1;
  }
}

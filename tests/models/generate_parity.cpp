// loom::models::generate on a transformers checkpoint against transformers' generate
// (tests/models/generate_vs_transformers.py writes FOLDER/expected-generate.safetensors and runs this):
//   generate-parity FOLDER {local|ddp|fsdp} [--lora ADAPTER]
// builds the plan with pretrained(FOLDER) (and lora(4, {q_proj, v_proj, down_proj}, alpha 8) with
// PEFT's adapter loaded by job.load_adapter), then, inside job.with_whole_module on every rank,
// generates from transformers' prompts and compares token for token: greedy with the kv_cache and
// without it, with an end token, and sampled with transformers' seed and warpers (with --lora: greedy,
// with and without the cache, against PEFT's model).
#include "named_tensor.hpp"

#include <loom/io/safetensors.hpp>
#include <loom/loom.hpp>
#include <loom/models/causal_lm.hpp>
#include <loom/models/generate.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
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
using loom::models::generation_options;

constexpr std::int64_t new_tokens = 24;
// generate_vs_transformers.py's sampling.
const generation_options sampling{
    .max_new_tokens = new_tokens, .do_sample = true, .temperature = 0.8, .top_k = 50, .top_p = 0.9, .seed = 11};

struct arguments {
  fs::path folder;
  std::string_view strategy;
  std::optional<fs::path> adapter{};
};

// One line a comparison; false when the tokens differ.
bool same_tokens(int rank, const arguments& args, std::string_view what, const at::Tensor& ours,
                 const at::Tensor& theirs) {
  const bool same = ours.sizes() == theirs.sizes() && ours.equal(theirs);
  std::string where;
  if (!same && ours.sizes() == theirs.sizes()) {
    const at::Tensor differ = ours.ne(theirs).nonzero()[0];
    const std::int64_t row = differ[0].item<std::int64_t>(), column = differ[1].item<std::int64_t>();
    where = fmt::format(", first at [{}, {}]: {} where transformers has {}", row, column,
                        ours[row][column].item<std::int64_t>(), theirs[row][column].item<std::int64_t>());
  }
  fmt::print("rank {}: {} {} {}: {} tokens {} transformers' {}{}\n", rank, args.folder.filename().string(),
             args.strategy, what, fmt::join(ours.sizes(), "x"), same ? "equal to" : "DIFFER from",
             fmt::join(theirs.sizes(), "x"), where);
  return same;
}

template <class Job>
bool compare(Job& job, const arguments& args) {
  const std::vector<loom::named_tensor> expected =
      loom::load_safetensors(args.folder / "expected-generate.safetensors").tensors;
  const at::Tensor prompts = named(expected, "prompts");
  const int rank = job.rank();
  return job.with_whole_module([&](loom::models::CausalLM& model) {
    const auto run = [&](const generation_options& options) {
      return loom::models::generate(model, prompts, options).to(at::kCPU);
    };
    bool ok = true;
    const std::string_view greedy = args.adapter ? "lora" : "greedy";
    ok &= same_tokens(rank, args, greedy, run({.max_new_tokens = new_tokens}), named(expected, greedy));
    ok &= same_tokens(rank, args, fmt::format("{} without the cache", greedy),
                      run({.max_new_tokens = new_tokens, .use_cache = false}), named(expected, greedy));
    if (args.adapter) return ok;
    const std::int64_t eos = named(expected, "eos_token_id")[0].item<std::int64_t>();
    ok &= same_tokens(rank, args, fmt::format("end token {}", eos),
                      run({.max_new_tokens = new_tokens, .eos_token_id = {eos}, .pad_token_id = 0}),
                      named(expected, "eos"));
    ok &= same_tokens(rank, args, "sampled", run(sampling), named(expected, "sampled"));
    return ok;
  });
}

template <class Plan>
bool run(const Plan& plan, const arguments& args) {
  auto job = loom::build(plan, loom::runtime::from_env());
  if (args.adapter) job.load_adapter(*args.adapter);
  return compare(job, args);
}

template <class Plan>
bool with_strategy(const Plan& plan, const arguments& args) {
  if (args.strategy == "local") return run(plan | loom::local(), args);
  if (args.strategy == "ddp") return run(plan | loom::ddp(), args);
  if (args.strategy == "fsdp") return run(plan | loom::fsdp(), args);
  throw std::invalid_argument(fmt::format("unknown strategy '{}': local, ddp or fsdp", args.strategy));
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string_view> words(argv + 1, argv + argc);
  if (words.size() < 2) {
    fmt::print(stderr, "usage: generate-parity FOLDER {{local|ddp|fsdp}} [--lora ADAPTER]\n");
    return 2;
  }
  arguments args{.folder = words[0], .strategy = words[1]};
  for (std::size_t i = 2; i < words.size(); ++i) {
    if (words[i] == "--lora" && i + 1 < words.size()) {
      args.adapter = fs::path(words[++i]);
    } else {
      fmt::print(stderr, "generate-parity: unexpected '{}'\n", words[i]);
      return 2;
    }
  }
  try {
    const auto config = loom::models::causal_lm_config::from_pretrained(args.folder);
    const auto base =
        loom::model<loom::models::CausalLM>(config) | loom::seeded(0) | loom::pretrained(args.folder.string());
    const bool ok = args.adapter
                        ? with_strategy(base | loom::lora(4, {"q_proj", "v_proj", "down_proj"}, {.alpha = 8}), args)
                        : with_strategy(base, args);
    return ok ? 0 : 1;
  } catch (const std::exception& error) {
    fmt::print(stderr, "generate-parity: {}\n", error.what());
    return 1;
  }
}

// tiny-gpt, loom's flagship recipe: a character-level GPT pretrained with data parallelism on the
// licence texts every Debian machine has, saved, then adapted with LoRA to one text held apart.
// Each phase checkpoints as it goes; started again with the same --out, the run resumes where it
// stopped.
//
//   build/loom-run --nproc-per-node 2 -- build/dsl_examples/tiny-gpt [--steps-pretrain N]
//       [--steps-adapt N] [--checkpoint-every N] [--out DIR]
//       [--config dsl_examples/configs/tiny-gpt-adapt-ddp.toml [--lora.rank=16 ...]]
//
// Phase 1: model<TinyGpt> | seeded | ddp. Each rank samples its own batches; the DDP reducer
//          averages the gradients. Rank 0 saves the weights.
// Phase 2: model<TinyGpt> | seeded | pretrained | lora | fsdp. Each rank constructs and reads only its
//          rows of the pretrained weights, LoRA adapts them, and only the adapters train. The frozen
//          base is sharded across the ranks (each block a loom::nn::Unit), the adapters are
//          replicated. With --config, phase 2's stages after the model and its loop come from a run
//          file instead (one per strategy in dsl_examples/configs/), with dotted overrides; the
//          pretrained stage is the recipe's.
#include "models/tiny_gpt.hpp"
#include "common/command_line.hpp"
#include "models/text_data.hpp"

#include <loom/base/text.hpp>
#include <loom/config/run_file.hpp>
#include <loom/loom.hpp>
#include <loom/optim/adamw.hpp>
#include <loom/train/loop.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/core.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace fs = std::filesystem;

namespace {

using text_data::batch_sampler;
using text_data::decode;
using text_data::encode;
using text_data::load_tokens;

// Bytes & 127 as tokens: the licences are ASCII, so nothing is lost.
constexpr models::tiny_gpt_config model_config{.vocab = 128, .d = 128, .layers = 2, .heads = 4, .ctx = 64};
constexpr std::uint64_t model_seed = 42;
constexpr std::int64_t batch_per_rank = 16;
constexpr double clip_norm = 1.0;

const fs::path licence_folder = "/usr/share/common-licenses";
constexpr std::string_view preferred_held_apart = "GPL-3";
constexpr std::string_view sample_prompt = "You may ";
constexpr int sample_length = 120;
constexpr double sample_temperature = 0.7;  // below 1: likelier characters, fewer typos

// ---------------------------------------------------------------- command line

struct options {
  int steps_pretrain = 800;
  int steps_adapt = 300;
  int checkpoint_every = 100;
  std::string out = (fs::temp_directory_path() / "loom-tiny-gpt").string();
  recipes::run_file_arguments adapt_config;  // phase 2 from a run file, when --config is given
  bool steps_pretrain_given = false;         // with --config, pretrained weights are reused unless it is
};

// The options, or the exit code to end with (--help, a bad command line).
std::variant<options, int> parse_options(int argc, char** argv) {
  options parsed;
  CLI::App app{
      "loom's flagship recipe: a character-level GPT pretrained with ddp() on the licence texts, then "
      "adapted with LoRA under fsdp() to one text held apart.",
      "tiny-gpt"};
  const auto positive = CLI::Range(1, 1'000'000);
  app.add_option("--steps-pretrain", parsed.steps_pretrain, "optimizer steps of phase 1, data-parallel pretraining")
      ->capture_default_str()
      ->check(positive);
  auto* steps_adapt = app.add_option("--steps-adapt", parsed.steps_adapt, "optimizer steps of phase 2, LoRA adaptation")
                          ->capture_default_str()
                          ->check(positive);
  app.add_option("--checkpoint-every", parsed.checkpoint_every,
                 "steps between checkpoints; run again with the same --out to resume from the newest one (also "
                 "after SIGTERM or SIGUSR1, which stop the run after a checkpoint with exit code 75)")
      ->capture_default_str()
      ->check(positive);
  app.add_option("--out", parsed.out,
                 "every rank must see it; it receives pretrain/ and adapt/ (each phase's checkpoints/ and "
                 "metrics.jsonl), pretrained/ (the base weights, safetensors in Hugging Face's layout), adapter/ (the "
                 "LoRA adapter in PEFT's format) and adapted/ (the weights with the adapters merged)")
      ->capture_default_str();
  parsed.adapt_config.add_to(app, /*required=*/false);
  app.get_option("--config")
      ->description(
          "phase 2 from a run file: its stages after the pretrained model and its loop "
          "(dsl_examples/configs/tiny-gpt-adapt-*.toml); train.out defaults to --out/adapt-<its name>")
      ->excludes(steps_adapt);
  if (const auto exit_code = recipes::parse_command_line(app, argc, argv)) return *exit_code;
  parsed.steps_pretrain_given = app.count("--steps-pretrain") > 0;
  if (parsed.adapt_config.config.empty() && !parsed.adapt_config.overrides.empty()) {
    fmt::print(stderr, "tiny-gpt: {} overrides a run file: give --config FILE\n",
               parsed.adapt_config.overrides.front());
    return recipes::usage_exit_code;
  }
  return parsed;
}

// ---------------------------------------------------------------- text

struct corpus_files {
  std::vector<fs::path> pretrain;
  fs::path held_apart;
};

// The regular files under `folder`, each once (GPL is a link to GPL-3), sorted so that every rank
// reads the same texts in the same order.
std::vector<fs::path> text_files(const fs::path& folder) {
  std::error_code error;
  std::set<fs::path> unique;
  for (const auto& entry : fs::directory_iterator(folder, error)) {
    if (entry.is_regular_file(error) && entry.file_size(error) > 0) unique.insert(fs::canonical(entry.path(), error));
  }
  unique.erase(fs::path{});
  return {unique.begin(), unique.end()};
}

// GPL-3 is held apart where it exists, otherwise the largest text; the rest is for pretraining.
corpus_files split_corpus(const fs::path& folder) {
  constexpr std::string_view origin = "Debian's base-files package installs the licence texts there";
  if (!fs::is_directory(folder)) {
    throw std::runtime_error("no text files: " + folder.string() + " is not a folder (" + std::string(origin) + ")");
  }
  std::vector<fs::path> files = text_files(folder);
  if (files.size() < 2) {
    throw std::runtime_error("found " + std::to_string(files.size()) + " text file(s) in " + folder.string() +
                             ": tiny-gpt needs two, one to pretrain on and one to adapt to (" + std::string(origin) +
                             ")");
  }
  auto held = std::ranges::find(files, preferred_held_apart, [](const fs::path& p) { return p.filename().string(); });
  if (held == files.end()) {
    held = std::ranges::max_element(files, {}, [](const fs::path& p) { return fs::file_size(p); });
  }
  corpus_files corpus{.pretrain = {}, .held_apart = *held};
  files.erase(held);
  corpus.pretrain = std::move(files);
  return corpus;
}

// ---------------------------------------------------------------- the model

// Temperature sampling from a fixed prompt with a fixed generator: runs compare like with like.
std::string sample(models::TinyGpt& model) {
  torch::NoGradGuard no_grad;
  auto generator = at::make_generator<at::CPUGeneratorImpl>(0);
  auto tokens = encode(sample_prompt).unsqueeze(0);
  for (int i = 0; i < sample_length; ++i) {
    auto window = tokens.slice(1, std::max<std::int64_t>(0, tokens.size(1) - model_config.ctx));
    auto logits = model.logits(window).select(1, -1) / sample_temperature;
    auto next = torch::multinomial(logits.softmax(-1), 1, false, generator);
    tokens = torch::cat({tokens, next}, 1);
  }
  return decode(tokens.squeeze(0));
}

// ---------------------------------------------------------------- training

bool is_leader(const loom::runtime& rt) { return rt.rank() == 0; }

// Rank 0 speaks for the job; flushed, so the launcher relays each line as it comes.
template <class... Args>
void say(const loom::runtime& rt, fmt::format_string<Args...> format, Args&&... args) {
  if (!is_leader(rt)) return;
  fmt::print(format, std::forward<Args>(args)...);
  std::fflush(stdout);
}

// The loop of a phase built into the recipe: a short warmup to `peak_lr`, then the second half
// decays (cosine) to a tenth; the loss on the held-out text four times a phase, progress ten times.
loom::train_options phase_options(std::string name, int steps, double peak_lr, int checkpoint_every, fs::path out) {
  return {.steps = steps,
          .clip_norm = clip_norm,
          .lr = loom::lr_schedule{.peak = peak_lr,
                                  .warmup_steps = std::min(40, steps / 10),
                                  .decay_steps = steps / 2,
                                  .total_steps = steps,
                                  .decay = loom::decay_shape::cosine,
                                  .floor = 0.1},
          .out = std::move(out),
          .checkpoint_every = checkpoint_every,
          .eval_every = std::max(1, steps / 4),
          .log_every = std::max(1, steps / 10),
          .name = std::move(name)};
}

// Trains `job` on `tokens` with loom::train (resuming from the newest checkpoint in options.out),
// evaluating on `held_out`; each rank draws its own batches, from `data_seed` offset by its rank.
// False when a SIGTERM or SIGUSR1 stopped it (checkpointed, to be resumed).
template <class Job>
bool train(Job& job, loom::train_options options, std::uint64_t data_seed, const at::Tensor& tokens,
           const at::Tensor& held_out) {
  const loom::runtime& rt = job.rt();
  const batch_sampler batches(tokens, data_seed, rt.rank(), rt.world_size(), batch_per_rank, model_config.ctx);
  const batch_sampler evaluation(held_out, data_seed + 500, rt.rank(), rt.world_size(), batch_per_rank,
                                 model_config.ctx);
  const double peak = options.lr ? options.lr->peak : 1e-3;
  loom::optim::AdamW optimizer(job.trainable_parameters(), torch::optim::AdamWOptions(peak).weight_decay(0.01));
  options.tokens_per_micro_batch = batch_per_rank * model_config.ctx;
  const loom::train_result result = loom::train(job, optimizer,
                                                {.loss =
                                                     [&](std::int64_t step, int micro) {
                                                       auto [inputs, targets] =
                                                           batches.at_step((step - 1) * options.accumulate + micro);
                                                       return job.forward(inputs, targets);
                                                     },
                                                 .eval_loss =
                                                     [&] {
                                                       auto [inputs, targets] = evaluation.at_step(0);
                                                       return job.forward(inputs, targets);
                                                     }},
                                                options);
  return result.outcome == loom::train_outcome::finished;
}

// A sample of `job`'s model, said by rank 0: the model called directly, inside with_whole_module,
// which under fsdp() gathers its parameters (on every rank) for the length of the call.
template <class Job>
void print_sample(Job& job, std::string_view when) {
  const loom::runtime& rt = job.rt();
  const std::string text =
      job.with_whole_module([&](models::TinyGpt& model) { return is_leader(rt) ? sample(model) : std::string(); });
  say(rt, "{}, from \"{}\":\n  {}\n", when, sample_prompt, text);
}

// Phase 1: every parameter trains; the pretrained weights go to `weights`. Skipped when they are
// there already from as many steps or more (a run started again after phase 1), or when phase 2
// comes from a run file and --steps-pretrain is not given (the run file's phase reuses them); with
// more steps asked for, it goes on from its last checkpoint, and phase 2, whose checkpoints in
// `adapt_out` were adapted over the weights it changes, starts afresh. Each is said before it is
// done. False when stopped to be resumed.
bool pretrain(const loom::runtime& rt, const options& opts, const corpus_files& corpus, const fs::path& weights,
              const fs::path& adapt_out) {
  const fs::path out = fs::path(opts.out) / "pretrain";
  if (fs::exists(weights / "model.safetensors")) {
    const auto latest = loom::checkpointer(rt, {.folder = out / "checkpoints"}).latest();
    const std::int64_t done = latest ? loom::read_checkpoint_manifest(*latest).step : 0;
    const bool reused = !opts.adapt_config.config.empty() && !opts.steps_pretrain_given;
    if (done >= opts.steps_pretrain || reused) {
      say(rt, "== phase 1: {}, {} holds the weights of {} steps{}\n\n", reused ? "reused" : "done already",
          weights.string(), done,
          reused && done < opts.steps_pretrain
              ? fmt::format(" (--steps-pretrain {} pretrains them further, and phase 2 then starts afresh)",
                            opts.steps_pretrain)
          : done > opts.steps_pretrain
              ? fmt::format(", more than --steps-pretrain {} (give another --out to pretrain {} steps afresh)",
                            opts.steps_pretrain, opts.steps_pretrain)
              : std::string());
      return true;
    }
    const bool adapted_before = fs::exists(adapt_out / "checkpoints");
    say(rt, "== phase 1: {} holds the weights of {} steps; going on to --steps-pretrain {}{}\n", weights.string(), done,
        opts.steps_pretrain,
        adapted_before ? fmt::format(", after which phase 2 starts afresh: its checkpoints in {} were adapted over "
                                     "the {}-step weights (removed now)",
                                     (adapt_out / "checkpoints").string(), done)
                       : std::string());
    if (adapted_before && is_leader(rt)) fs::remove_all(adapt_out / "checkpoints");
  }
  const auto plan = loom::model<models::TinyGpt>(model_config) | loom::seeded(model_seed) | loom::ddp();
  auto job = loom::build(plan, rt);
  const auto tokens = load_tokens(corpus.pretrain);
  const auto unseen = load_tokens({corpus.held_apart});  // evaluated on, never trained on in this phase
  say(rt, "== phase 1: pretraining on {} in {} ({} characters), {}\n{}\n",
      loom::counted(static_cast<std::int64_t>(corpus.pretrain.size()), "text"), licence_folder.string(), tokens.numel(),
      loom::counted(rt.world_size(), "rank"), job.describe());
  if (!train(job, phase_options("pretrain", opts.steps_pretrain, 2e-3, opts.checkpoint_every, out), 1000, tokens,
             unseen)) {
    return false;
  }
  print_sample(job, "after pretraining");
  job.save_weights(weights);  // every rank returns once rank 0 has written it: phase 2 reads it
  say(rt, "saved {}\n\n", weights.string());
  return true;
}

// Phase 2 on `job`, whose plan puts LoRA adapters on the pretrained weights (or, from a run file
// without a lora stage, trains them in full): adapted to the text held apart, its last tenth held
// out for evaluation.
template <class Job>
bool adapt(Job& job, bool has_adapters, const loom::train_options& train_options, const corpus_files& corpus,
           const fs::path& results) {
  const loom::runtime& rt = job.rt();
  const auto text = load_tokens({corpus.held_apart});
  const std::int64_t split = text.numel() * 9 / 10;
  const auto tokens = text.narrow(0, 0, split);
  const auto held_out = text.narrow(0, split, text.numel() - split);
  say(rt, "== phase 2: adapting to {} ({} characters), held apart from pretraining\n{}\n", corpus.held_apart.string(),
      tokens.numel(), job.describe());
  print_sample(job, "before adapting (lora_B starts at zero: the pretrained model's sample)");
  if (!train(job, train_options, 2000, tokens, held_out)) return false;

  if (has_adapters) {
    job.save_adapter(results / "adapter");
    say(rt, "saved {} (PEFT's LoRA format)\n", (results / "adapter").string());
    job.merge();  // merged, the adapted weights are a plain TinyGpt's
  }
  print_sample(job, "after adapting");
  job.save_weights(results / "adapted");
  say(rt, "saved {}{}\n", (results / "adapted").string(), has_adapters ? " (adapters merged)" : "");
  return true;
}

// Phase 2's plan from the run file of --config, checked by the compiler's rules (plan_error), and
// its loop's options, with train.out defaulting to --out/adapt-<the run file's name>: a folder of
// its own, so that it does not meet the built-in phase 2's checkpoints.
auto adapt_plan_from_file(const options& opts, const fs::path& weights) {
  const std::string& config = opts.adapt_config.config;
  const std::vector<std::string>& overrides = opts.adapt_config.overrides;
  // The pretrained stage first, so that the user's overrides have the last word.
  std::vector<std::string> with_weights{"pretrained=" + weights.string()};
  with_weights.insert(with_weights.end(), overrides.begin(), overrides.end());
  const loom::run_file file = loom::read_run_file(config, with_weights);
  auto plan = loom::plan_from_file(loom::model<models::TinyGpt>(model_config), file);
  loom::train_options train_options = file.train;
  if (train_options.out.empty()) train_options.out = fs::path(opts.out) / ("adapt-" + fs::path(config).stem().string());
  if (train_options.name.empty()) train_options.name = "adapt";
  return std::pair{std::move(plan), std::move(train_options)};
}

// Phase 2 as the recipe writes it: LoRA on the attention's q and v projections under fsdp(), its
// adapter and adapted weights in --out; or as the run file of --config says, everything it writes in
// its own folder.
bool adapt(const loom::runtime& rt, const options& opts, const corpus_files& corpus, const fs::path& weights) {
  if (opts.adapt_config.config.empty()) {
    const auto plan = loom::model<models::TinyGpt>(model_config) | loom::seeded(model_seed) |
                      loom::pretrained(weights.string()) | loom::lora(8, {"q_proj", "v_proj"}) | loom::fsdp();
    const fs::path out = fs::path(opts.out) / "adapt";
    auto job = loom::build(plan, rt);
    return adapt(job, true, phase_options("adapt", opts.steps_adapt, 5e-3, opts.checkpoint_every, out), corpus,
                 opts.out);
  }
  const auto [plan, train_options] = adapt_plan_from_file(opts, weights);
  auto built = loom::build(plan, rt);
  // Named again: clang before 16 (scripts/test --sanitize) cannot capture a structured binding.
  const bool with_lora = plan.find<loom::lora_stage>().has_value();
  const loom::train_options& phase = train_options;
  return std::visit([&](auto& job) { return adapt(job, with_lora, phase, corpus, phase.out); }, built);
}

}  // namespace

int main(int argc, char** argv) {
  const auto parsed = parse_options(argc, argv);
  if (const int* exit_code = std::get_if<int>(&parsed)) return *exit_code;
  const options& opts = std::get<options>(parsed);
  try {
    const corpus_files corpus = split_corpus(licence_folder);
    const loom::runtime rt = loom::runtime::from_env();
    std::error_code out_error;
    fs::create_directories(opts.out, out_error);
    if (out_error) {
      throw std::runtime_error(
          fmt::format("--out {} cannot be created: {}; give a folder you can write to", opts.out, out_error.message()));
    }
    const fs::path weights = fs::path(opts.out) / "pretrained";
    // A run file that cannot work stops the run now, not after phase 1.
    const fs::path adapt_out = opts.adapt_config.config.empty() ? fs::path(opts.out) / "adapt"
                                                                : adapt_plan_from_file(opts, weights).second.out;
    // Stopped by SIGTERM or SIGUSR1 after a checkpoint: the same command resumes.
    if (!pretrain(rt, opts, corpus, weights, adapt_out) || !adapt(rt, opts, corpus, weights)) {
      return loom::resumable_exit_code;
    }
    return 0;
  } catch (const std::exception& error) {
    fmt::print(stderr, "tiny-gpt: {}\n", error.what());
    return 1;
  }
}

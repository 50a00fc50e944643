// tiny-gpt, loom's flagship recipe: a character-level GPT pretrained with data parallelism on the
// licence texts every Debian machine has, saved, then adapted with LoRA to one text held apart.
// Each phase checkpoints as it goes; started again with the same --out, the run resumes where it
// stopped.
//
//   build/loom-run --nproc-per-node 2 -- build/dsl_examples/tiny-gpt [--steps-pretrain N]
//       [--steps-adapt N] [--checkpoint-every N] [--out DIR]
//
// Phase 1: model<TinyGpt> | seeded | ddp. Each rank samples its own batches; the DDP reducer
//          averages the gradients. Rank 0 saves the weights.
// Phase 2: model<PretrainedTinyGpt> | seeded | lora | fsdp. The pretrained weights are loaded as the
//          model is constructed, so LoRA adapts them; only the adapters train. The frozen base is
//          sharded across the ranks (each block a loom::nn::Unit), the adapters are replicated.
#include "models/tiny_gpt.hpp"
#include "models/text_data.hpp"

#include <loom/loom.hpp>
#include <loom/runtime/text.hpp>
#include <loom/train/loop.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/core.h>
#include <torch/torch.h>

#include <algorithm>
#include <charconv>
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
  bool help = false;
  int steps_pretrain = 800;
  int steps_adapt = 300;
  int checkpoint_every = 100;
  fs::path out = fs::temp_directory_path() / "loom-tiny-gpt";
};

class usage_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

constexpr std::string_view usage =
    "usage: tiny-gpt [--steps-pretrain N] [--steps-adapt N] [--checkpoint-every N] [--out DIR]\n"
    "  --steps-pretrain N    optimizer steps of phase 1, data-parallel pretraining (default 800)\n"
    "  --steps-adapt N       optimizer steps of phase 2, LoRA adaptation (default 300)\n"
    "  --checkpoint-every N  steps between checkpoints (default 100); run again with the same --out\n"
    "                        to resume from the newest one (also after SIGTERM or SIGUSR1, which\n"
    "                        stop the run after a checkpoint with exit code 75)\n"
    "  --out DIR             every rank must see it (default $TMPDIR/loom-tiny-gpt); it receives\n"
    "                          pretrain/, adapt/  each phase's checkpoints/ and metrics.jsonl\n"
    "                          pretrained/  the base weights (safetensors, Hugging Face's layout)\n"
    "                          adapter/     the LoRA adapter in PEFT's format\n"
    "                                       (PeftModel.from_pretrained reads it)\n"
    "                          adapted/     the adapted weights, adapters merged (a plain model)\n";

int parse_steps(std::string_view flag, std::string_view text) {
  int value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc{} || end != text.data() + text.size() || value < 1) {
    throw usage_error(std::string(flag) + " expects a positive whole number, got '" + std::string(text) + "'");
  }
  return value;
}

options parse_options(int argc, char** argv) {
  options parsed;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      parsed.help = true;
      continue;
    }
    if (flag != "--steps-pretrain" && flag != "--steps-adapt" && flag != "--checkpoint-every" && flag != "--out") {
      throw usage_error("unknown option '" + std::string(flag) + "'");
    }
    if (i + 1 == argc) throw usage_error(std::string(flag) + " expects a value");
    const std::string_view value = argv[++i];
    if (flag == "--steps-pretrain") parsed.steps_pretrain = parse_steps(flag, value);
    if (flag == "--steps-adapt") parsed.steps_adapt = parse_steps(flag, value);
    if (flag == "--checkpoint-every") parsed.checkpoint_every = parse_steps(flag, value);
    if (flag == "--out") parsed.out = value;
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

// TinyGpt with its pretrained weights (safetensors, by name) loaded as it is constructed: the plan
// builds it, so LoRA adapts these weights and seeded(...) draws only the adapters.
class PretrainedTinyGpt : public models::TinyGpt {
 public:
  PretrainedTinyGpt(const models::tiny_gpt_config& config, const fs::path& weights) : models::TinyGpt(config) {
    (void)loom::copy_weights(*this, loom::load_weights(weights), /*strict=*/true,
                             &loom::lora_adapter::is_adapter_parameter);
  }
};

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

struct phase {
  std::string name;
  int steps;
  double peak_learning_rate;  // after a short warmup; the second half decays (cosine) to a tenth
  std::uint64_t data_seed;    // offset by the rank: each rank samples its own batches
  int checkpoint_every;
  fs::path out;  // checkpoints/ and metrics.jsonl
};

// Trains `job` on `tokens` with loom::train: from the newest checkpoint in spec.out if there is
// one, a checkpoint every spec.checkpoint_every steps, the loss averaged over the ranks printed ten
// times a phase and, four times, the loss on `held_out`. Returns false when a SIGTERM or SIGUSR1
// stopped it (checkpointed, to be resumed).
template <class Job>
bool train(Job& job, const phase& spec, const at::Tensor& tokens, const at::Tensor& held_out) {
  const auto rank = static_cast<std::uint64_t>(job.rt().rank());
  const batch_sampler batches(tokens, spec.data_seed + rank, batch_per_rank, model_config.ctx);
  const batch_sampler evaluation(held_out, spec.data_seed + 500 + rank, batch_per_rank, model_config.ctx);
  torch::optim::AdamW optimizer(job.trainable_parameters(),
                                torch::optim::AdamWOptions(spec.peak_learning_rate).weight_decay(0.01));
  const loom::lr_schedule lr{.peak = spec.peak_learning_rate,
                             .warmup_steps = std::min(40, spec.steps / 10),
                             .decay_steps = spec.steps / 2,
                             .total_steps = spec.steps,
                             .decay = loom::decay_shape::cosine,
                             .floor = 0.1};
  const loom::train_result result = loom::train(job, optimizer,
                                                {.loss =
                                                     [&](std::int64_t step, int) {
                                                       auto [inputs, targets] = batches.at_step(step);
                                                       return job.forward(inputs, targets);
                                                     },
                                                 .eval_loss =
                                                     [&] {
                                                       auto [inputs, targets] = evaluation.at_step(0);
                                                       return job.forward(inputs, targets);
                                                     }},
                                                {.steps = spec.steps,
                                                 .clip_norm = clip_norm,
                                                 .lr = lr,
                                                 .out = spec.out,
                                                 .checkpoint_every = spec.checkpoint_every,
                                                 .eval_every = std::max(1, spec.steps / 4),
                                                 .log_every = std::max(1, spec.steps / 10),
                                                 .tokens_per_micro_batch = batch_per_rank * model_config.ctx,
                                                 .name = spec.name});
  return result.outcome == loom::train_outcome::finished;
}

// `job`'s weights, whole, in a plain TinyGpt (adapters left out: zero, or merged into the weights):
// what the samples and the saved files are made from, under any strategy. Every rank calls it, since
// under fsdp() the whole weights are gathered.
template <class Job>
std::shared_ptr<models::TinyGpt> plain_copy(Job& job) {
  loom::tensor_state state = job.state_dict();
  std::erase_if(state, [](const loom::named_tensor& t) { return loom::lora_adapter::is_adapter_parameter(t.name); });
  auto plain = std::make_shared<models::TinyGpt>(model_config);
  loom::load_module_state(*plain, state);
  return plain;
}

void print_sample(const loom::runtime& rt, models::TinyGpt& model, std::string_view when) {
  say(rt, "{}, from \"{}\":\n  {}\n", when, sample_prompt, is_leader(rt) ? sample(model) : std::string());
}

// Phase 1: every parameter trains; the pretrained weights go to `weights`. Skipped when they are
// there already (a run started again after phase 1). False when stopped to be resumed.
bool pretrain(const loom::runtime& rt, const options& opts, const corpus_files& corpus, const fs::path& weights) {
  if (fs::exists(weights / "model.safetensors")) {
    say(rt, "== phase 1: done already, {} holds the pretrained weights\n\n", weights.string());
    return true;
  }
  const auto plan = loom::model<models::TinyGpt>(model_config) | loom::seeded(model_seed) | loom::ddp();
  auto job = loom::build(plan, rt);
  const auto tokens = load_tokens(corpus.pretrain);
  const auto unseen = load_tokens({corpus.held_apart});  // evaluated on, never trained on in this phase
  say(rt, "== phase 1: pretraining on {} in {} ({} characters), {}\n{}\n",
      loom::counted(static_cast<std::int64_t>(corpus.pretrain.size()), "text"), licence_folder.string(), tokens.numel(),
      loom::counted(rt.world_size(), "rank"), job.describe());

  if (!train(job,
             {.name = "pretrain",
              .steps = opts.steps_pretrain,
              .peak_learning_rate = 2e-3,
              .data_seed = 1000,
              .checkpoint_every = opts.checkpoint_every,
              .out = opts.out / "pretrain"},
             tokens, unseen)) {
    return false;
  }
  print_sample(rt, *plain_copy(job), "after pretraining");
  job.save_weights(weights);  // every rank returns once rank 0 has written it: phase 2 reads it
  say(rt, "saved {}\n\n", weights.string());
  return true;
}

// Phase 2: LoRA adapters on the attention's q and v projections; the pretrained weights stay frozen.
bool adapt(const loom::runtime& rt, const options& opts, const corpus_files& corpus, const fs::path& weights) {
  const auto plan = loom::model<PretrainedTinyGpt>(model_config, weights) | loom::seeded(model_seed) |
                    loom::lora(8, {"q_proj", "v_proj"}) | loom::fsdp();
  auto job = loom::build(plan, rt);
  const auto text = load_tokens({corpus.held_apart});
  const std::int64_t split = text.numel() * 9 / 10;  // the last tenth is held out for evaluation
  const auto tokens = text.narrow(0, 0, split);
  const auto held_out = text.narrow(0, split, text.numel() - split);
  say(rt, "== phase 2: adapting to {} ({} characters), held apart from pretraining\n{}\n", corpus.held_apart.string(),
      tokens.numel(), job.describe());
  print_sample(rt, *plain_copy(job), "before adapting (lora_B starts at zero: the pretrained model's sample)");

  if (!train(job,
             {.name = "adapt",
              .steps = opts.steps_adapt,
              .peak_learning_rate = 5e-3,
              .data_seed = 2000,
              .checkpoint_every = opts.checkpoint_every,
              .out = opts.out / "adapt"},
             tokens, held_out)) {
    return false;
  }
  job.save_adapter(opts.out / "adapter");
  say(rt, "saved {} (PEFT's LoRA format)\n", (opts.out / "adapter").string());

  // Merged, the adapted weights are a plain TinyGpt's.
  job.merge();
  print_sample(rt, *plain_copy(job), "after adapting");
  job.save_weights(opts.out / "adapted");
  say(rt, "saved {} (adapters merged)\n", (opts.out / "adapted").string());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const options opts = parse_options(argc, argv);
    if (opts.help) {
      fmt::print("{}", usage);
      return 0;
    }
    const corpus_files corpus = split_corpus(licence_folder);
    const loom::runtime rt = loom::runtime::from_env();
    std::error_code out_error;
    fs::create_directories(opts.out, out_error);
    if (out_error) {
      throw std::runtime_error(fmt::format("--out {} cannot be created: {}; give a folder you can write to",
                                           opts.out.string(), out_error.message()));
    }
    const fs::path weights = opts.out / "pretrained";
    // Stopped by SIGTERM or SIGUSR1 after a checkpoint: the same command resumes.
    if (!pretrain(rt, opts, corpus, weights) || !adapt(rt, opts, corpus, weights)) return loom::resumable_exit_code;
    return 0;
  } catch (const usage_error& error) {
    fmt::print(stderr, "tiny-gpt: {}\n{}", error.what(), usage);
    return 2;
  } catch (const std::exception& error) {
    fmt::print(stderr, "tiny-gpt: {}\n", error.what());
    return 1;
  }
}

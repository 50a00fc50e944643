// finetune: LoRA fine-tuning of tiny-gpt's model from a run file alone. The model is a C++ type;
// the stages after it (seed, LoRA, strategy) and the loop's options come from the file, with
// command-line overrides in dotted form, checked with the compiler's rules and sentences.
//
//   build/loom-run --nproc-per-node 2 -- build/dsl_examples/finetune
//       --config dsl_examples/configs/finetune.json [--pretrained DIR] [--text FILE]
//       [--lora.rank=16] [--strategy=ddp] [--train.steps=100] ...
#include "models/text_data.hpp"
#include "models/tiny_gpt.hpp"

#include <loom/config/run_file.hpp>
#include <loom/loom.hpp>

#include <fmt/core.h>
#include <torch/optim/adamw.h>

#include <exception>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace fs = std::filesystem;

namespace {

constexpr models::tiny_gpt_config model_config{.vocab = 128, .d = 128, .layers = 2, .heads = 4, .ctx = 64};
constexpr std::int64_t batch_per_rank = 16;

constexpr std::string_view usage =
    "usage: finetune --config FILE [--pretrained DIR] [--text FILE] [--KEY=VALUE ...]\n"
    "  --config FILE      a run file: the stages after the model and the loop's options\n"
    "                     (docs/run_files.md; dsl_examples/configs/finetune.json)\n"
    "  --pretrained DIR   weights to start from (tiny-gpt's --out/pretrained); default: fresh ones\n"
    "  --text FILE        the text to fine-tune on (default /usr/share/common-licenses/GPL-3);\n"
    "                     its last tenth is held out for evaluation\n"
    "  --KEY=VALUE        overrides the run file: --lora.rank=16, --strategy=ddp, --train.steps=100\n";

struct options {
  fs::path config;
  fs::path pretrained;
  fs::path text = "/usr/share/common-licenses/GPL-3";
  std::vector<std::string> overrides;
};

class usage_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

options parse(int argc, char** argv) {
  options parsed;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      fmt::print("{}", usage);
      std::exit(0);
    }
    if (arg == "--config" || arg == "--pretrained" || arg == "--text") {
      if (i + 1 == argc) throw usage_error(std::string(arg) + " expects a value");
      const fs::path value = argv[++i];
      (arg == "--config" ? parsed.config : arg == "--pretrained" ? parsed.pretrained : parsed.text) = value;
    } else if (arg.starts_with("--") && arg.find('=') != std::string_view::npos) {
      parsed.overrides.emplace_back(arg.substr(2));
    } else {
      throw usage_error("unknown option '" + std::string(arg) + "'");
    }
  }
  if (parsed.config.empty()) throw usage_error("--config is required");
  return parsed;
}

// TinyGpt, from pretrained weights (safetensors, by name) when given.
class FineTunedGpt : public models::TinyGpt {
 public:
  FineTunedGpt(const models::tiny_gpt_config& config, const std::string& weights) : models::TinyGpt(config) {
    if (!weights.empty()) {
      (void)loom::copy_weights(*this, loom::load_weights(weights), /*strict=*/true,
                               &loom::lora_adapter::is_adapter_parameter);
    }
  }
};

int run(const options& opts) {
  // Everything from the file is checked before a process group or a model exists.
  const auto plan = loom::plan_from_file(loom::model<FineTunedGpt>(model_config, opts.pretrained.string()), opts.config,
                                         opts.overrides);
  const loom::train_options train_options = loom::read_train_options(opts.config, opts.overrides);
  const at::Tensor text = text_data::load_tokens({opts.text});
  const std::int64_t split = text.numel() * 9 / 10;

  auto built = loom::build(plan, loom::runtime::from_env());
  return std::visit(
      [&](auto& job) {
        const loom::runtime& rt = job.rt();
        if (rt.rank() == 0) fmt::print("{}\n", job.describe());
        const auto rank = static_cast<std::uint64_t>(rt.rank());
        const text_data::batch_sampler batches(text.narrow(0, 0, split), 3000 + rank, batch_per_rank, model_config.ctx);
        const text_data::batch_sampler held_out(text.narrow(0, split, text.numel() - split), 3500 + rank,
                                                batch_per_rank, model_config.ctx);
        const double peak = train_options.lr ? train_options.lr->peak : 1e-3;
        torch::optim::AdamW optimizer(job.trainable_parameters(), torch::optim::AdamWOptions(peak).weight_decay(0.01));
        loom::train_options with_tokens = train_options;
        with_tokens.tokens_per_micro_batch = batch_per_rank * model_config.ctx;
        with_tokens.name = "finetune";
        const loom::train_result result =
            loom::train(job, optimizer,
                        {.loss =
                             [&](std::int64_t step, int micro) {
                               auto [x, y] = batches.at_step((step - 1) * with_tokens.accumulate + micro);
                               return job.forward(x, y);
                             },
                         .eval_loss =
                             [&] {
                               auto [x, y] = held_out.at_step(0);
                               return job.forward(x, y);
                             }},
                        with_tokens);
        if (result.outcome == loom::train_outcome::preempted) return loom::resumable_exit_code;
        if (plan.lora()) {
          job.save_adapter(train_options.out / "adapter");
          if (rt.rank() == 0) fmt::print("saved {} (PEFT's LoRA format)\n", (train_options.out / "adapter").string());
        }
        return 0;
      },
      built);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const usage_error& error) {
    fmt::print(stderr, "finetune: {}\n{}", error.what(), usage);
    return 2;
  } catch (const std::exception& error) {
    fmt::print(stderr, "finetune: {}\n", error.what());
    return 1;
  }
}

// finetune: LoRA fine-tuning of tiny-gpt's model from a run file alone. The model is a C++ type;
// the stages after it (seed, LoRA, strategy) and the loop's options come from the file, with
// command-line overrides in dotted form, checked with the compiler's rules and sentences.
//
//   build/loom-run --nproc-per-node 2 -- build/dsl_examples/finetune
//       --config dsl_examples/configs/finetune.toml [--pretrained DIR] [--out DIR] [--text FILE]
//       [--lora.rank=16] [--strategy=ddp] [--train.steps=100] ...
#include "common/adapter.hpp"
#include "common/command_line.hpp"
#include "common/run_folder.hpp"
#include "models/text_data.hpp"
#include "models/tiny_gpt.hpp"

#include <loom/config/run_file.hpp>
#include <loom/loom.hpp>
#include <loom/optim/adamw.hpp>

#include <fmt/core.h>
#include <torch/optim/adamw.h>

#include <filesystem>
#include <string>
#include <variant>
#include <vector>

namespace fs = std::filesystem;

namespace {

constexpr models::tiny_gpt_config model_config{.vocab = 128, .d = 128, .layers = 2, .heads = 4, .ctx = 64};
constexpr std::int64_t batch_per_rank = 16;

struct options {
  recipes::run_file_arguments run_file;
  std::string pretrained;
  std::string text = "/usr/share/common-licenses/GPL-3";
};

// The options, or the exit code to end with (--help, a bad command line).
std::variant<options, int> parse(int argc, char** argv) {
  options parsed;
  CLI::App app{"LoRA fine-tuning of tiny-gpt's model from a run file alone.", "finetune"};
  parsed.run_file.add_to(app, /*required=*/true);
  parsed.run_file.add_folders_to(app, /*with_pretrained=*/false);  // its --pretrained is the model's own weights
  app.add_option("--pretrained", parsed.pretrained, "weights to start from (tiny-gpt's --out/pretrained)")
      ->check(CLI::ExistingDirectory);
  app.add_option("--text", parsed.text, "the text to fine-tune on; its last tenth is held out for evaluation")
      ->capture_default_str()
      ->check(CLI::ExistingFile);
  if (const auto exit_code = recipes::parse_command_line(app, argc, argv)) return *exit_code;
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
  const std::string& config = opts.run_file.config;
  const std::vector<std::string>& overrides = opts.run_file.overrides;
  const loom::run_file file = loom::read_run_file(config, overrides);
  const auto plan = loom::plan_from_file(loom::model<FineTunedGpt>(model_config, opts.pretrained), file);
  loom::train_options train_options = file.train;
  const std::string folder = recipes::choose_run_folder(train_options, "finetune");
  if (loom::parse_launch_env().rank == 0) fmt::print("{}\n", folder);
  const at::Tensor text = text_data::load_tokens({opts.text});
  const std::int64_t split = text.numel() * 9 / 10;

  auto built = loom::build(plan, loom::runtime::from_env());
  return std::visit(
      [&](auto& job) {
        const loom::runtime& rt = job.rt();
        if (rt.rank() == 0) fmt::print("{}\n", job.describe());
        const text_data::batch_sampler batches(text.narrow(0, 0, split), 3000, rt.rank(), rt.world_size(),
                                               batch_per_rank, model_config.ctx);
        const text_data::batch_sampler held_out(text.narrow(0, split, text.numel() - split), 3500, rt.rank(),
                                                rt.world_size(), batch_per_rank, model_config.ctx);
        const double peak = train_options.lr ? train_options.lr->peak : 1e-3;
        loom::optim::AdamW optimizer(job.trainable_parameters(), torch::optim::AdamWOptions(peak).weight_decay(0.01));
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
        recipes::save_adapter_if_adapted(job, plan, train_options.out / "adapter");
        return 0;
      },
      built);
}

}  // namespace

int main(int argc, char** argv) { return recipes::run_main<options>("finetune", argc, argv, parse, run); }

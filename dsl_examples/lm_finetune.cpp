// lm-finetune: LoRA fine-tuning of a Hugging Face causal language model (Llama, Mistral, Qwen2, Qwen3,
// Gemma 3: whichever its config.json names) on a token file, under
// loom::train, from a run file (TOML, JSON, or YAML in FastVideo's layout). The checkpoint is the
// plan's pretrained stage; its config.json gives the model. Checkpoints, resume, preemption and
// metrics are loom::train's; the adapter (PEFT's format) and, with --merged, the merged weights
// (transformers' format, config.json beside them) are written at the end. README.md has a run.
//
//   build/loom-run --nproc-per-node 2 -- build/dsl_examples/lm-finetune
//       --config dsl_examples/configs/lm_finetune.toml --tokens tokens.bin
//       [--batch-size 4] [--seq-len 128] [--merged] [--pretrained=DIR] [--lora.rank=16] [--train.steps=100] ...
#include "common/adapter.hpp"
#include "common/checkpoint_folder.hpp"
#include "common/command_line.hpp"
#include "models/text_data.hpp"
#include "models/token_file.hpp"

#include <loom/config/run_file.hpp>
#include <loom/loom.hpp>
#include <loom/models/causal_lm.hpp>
#include <loom/optim/adamw.hpp>

#include <fmt/core.h>
#include <torch/optim/adamw.h>

#include <filesystem>
#include <string>
#include <variant>

namespace fs = std::filesystem;

namespace {

struct options {
  recipes::run_file_arguments run_file;
  std::string tokens;
  std::int64_t batch_per_rank = 4;
  std::int64_t seq_len = 128;
  bool merged = false;
};

std::variant<options, int> parse(int argc, char** argv) {
  options parsed;
  CLI::App app{
      "LoRA fine-tuning of a Hugging Face causal language model (Llama, Mistral, Qwen2, Qwen3, Gemma 3) on a "
      "token file, from a run file.",
      "lm-finetune"};
  parsed.run_file.add_to(app, /*required=*/true);
  app.add_option("--tokens", parsed.tokens,
                 "an llm.c token file (dsl_examples/data/make_tokens.py); its last tenth is held out")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--batch-size", parsed.batch_per_rank, "sequences per rank and micro-batch")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--seq-len", parsed.seq_len, "tokens per sequence")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_flag("--merged", parsed.merged, "also write the weights with the adapters merged in, for transformers");
  if (const auto exit_code = recipes::parse_command_line(app, argc, argv)) return *exit_code;
  return parsed;
}

int run(const options& opts) {
  // Everything from the files is checked before a process group or a model exists.
  const auto& [config, overrides] = opts.run_file;
  const loom::run_file file = loom::read_run_file(config, overrides);
  const fs::path checkpoint = recipes::checkpoint_folder(file, config);
  const loom::models::causal_lm_config model_config = loom::models::causal_lm_config::from_pretrained(checkpoint);
  if (opts.seq_len > model_config.max_position_embeddings) {
    throw std::invalid_argument(fmt::format("--seq-len {} is longer than the checkpoint's max_position_embeddings {}",
                                            opts.seq_len, model_config.max_position_embeddings));
  }
  const at::Tensor tokens = token_file::load(opts.tokens, model_config.vocab_size);
  const std::int64_t split = tokens.numel() * 9 / 10;
  const auto plan = loom::plan_from_file(loom::model<loom::models::CausalLM>(model_config), file);
  const auto seeded = plan.find<loom::seeded_stage>();
  const std::uint64_t seed = seeded ? seeded->seed() : 0;
  // Before the model is built: too little data is a sentence, not a wait for the build.
  const loom::launch_env env = loom::parse_launch_env();
  loom::check_world_size(file, env.world_size);
  // Under sequence_parallel(k) the k ranks of a group read the same batches.
  const loom::data_parallel_place data =
      loom::data_parallel(plan.find<loom::sequence_parallel_stage>(), env.rank, env.world_size);
  const std::string knobs = "give a longer token file, a shorter --seq-len or a smaller --batch-size";
  const text_data::batch_sampler batches(tokens.narrow(0, 0, split), seed, data.rank, data.world_size,
                                         opts.batch_per_rank, opts.seq_len,
                                         fmt::format("the first nine tenths of --tokens '{}'", opts.tokens), knobs);
  const text_data::batch_sampler held_out(tokens.narrow(0, split, tokens.numel() - split), seed + 1, data.rank,
                                          data.world_size, opts.batch_per_rank, opts.seq_len,
                                          fmt::format("the held-out last tenth of --tokens '{}'", opts.tokens), knobs);

  auto built = loom::build(plan, loom::runtime::from_env());
  return std::visit(
      [&](auto& job) {
        const loom::runtime& rt = job.rt();
        if (rt.rank() == 0) {
          for (const std::string& note : file.notes) fmt::print("{}\n", note);
          fmt::print("{}\n", job.describe());
        }
        loom::train_options train_options = file.train;
        const double peak = train_options.lr ? train_options.lr->peak : 1e-3;
        loom::optim::AdamW optimizer(job.trainable_parameters(), torch::optim::AdamWOptions(peak).weight_decay(0.0));
        // Each rank's share of a micro-batch's tokens: under sequence_parallel(k), 1/k of its sequences.
        train_options.tokens_per_micro_batch = opts.batch_per_rank * opts.seq_len * data.world_size / rt.world_size();
        train_options.name = "lm-finetune";
        const auto loss_of = [&](const at::Tensor& ids) {
          return loom::models::causal_lm_loss(job.forward(ids), ids, job.module()->model->sequence);
        };
        const loom::train_result result =
            loom::train(job, optimizer,
                        {.loss =
                             [&](std::int64_t step, int micro) {
                               return loss_of(batches.at_step((step - 1) * train_options.accumulate + micro).first);
                             },
                         .eval_loss = [&] { return loss_of(held_out.at_step(0).first); }},
                        train_options);
        if (result.outcome == loom::train_outcome::preempted) return loom::resumable_exit_code;
        recipes::save_adapter_if_adapted(job, plan, train_options.out / "adapter");
        if (opts.merged) {
          const fs::path merged = train_options.out / "merged";
          if (plan.find<loom::lora_stage>()) job.merge();
          job.save_pretrained(merged);  // in the checkpoint's dtypes, with its config and tokenizer files
          if (rt.rank() == 0) {
            fmt::print("saved {} (transformers' format: {}.from_pretrained)\n", merged.string(),
                       loom::models::architecture_of(model_config.family));
          }
        }
        return 0;
      },
      built);
}

}  // namespace

int main(int argc, char** argv) { return recipes::run_main<options>("lm-finetune", argc, argv, parse, run); }

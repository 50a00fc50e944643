// lm-finetune: LoRA fine-tuning of a Hugging Face causal language model (Llama, Mistral, Qwen2, Qwen3,
// Gemma 3: whichever its config.json names) on text (JSON Lines or plain, tokenized as it is read with
// the tokenizer.json of --tokenizer or the checkpoint, no Python), on chat records (--chat: rendered
// with the checkpoint's chat template, the loss on the assistant's tokens, packed) or on a token file, under
// loom::train, from a run file (TOML, JSON, or YAML in FastVideo's layout). The checkpoint is the
// plan's pretrained stage; its config.json gives the model. Checkpoints (with each rank's position in
// the text), resume, preemption and metrics are loom::train's; the adapter (PEFT's format) and, with
// --merged, the merged weights (transformers' format, config.json beside them) are written at the
// end. README.md has a run.
//
//   build/loom-run --nproc-per-node 2 -- build/dsl_examples/lm-finetune
//       --config dsl_examples/configs/lm_finetune.toml --pretrained DIR [--out DIR]
//       {--data FILE.jsonl [--chat] [--eval-data FILE] [--tokenizer DIR] | --tokens tokens.bin} [--batch-size 4]
//       [--seq-len 128] [--merged] [--sample PROMPT [--max-new-tokens 40] [--temperature T --top-p P]]
//       [--lora.rank=16] ...
#include "common/adapter.hpp"
#include "common/chat_batches.hpp"
#include "common/checkpoint_folder.hpp"
#include "common/command_line.hpp"
#include "common/run_folder.hpp"
#include "common/text_batches.hpp"
#include "models/text_data.hpp"
#include "models/token_file.hpp"

#include <loom/base/text.hpp>
#include <loom/config/run_file.hpp>
#include <loom/loom.hpp>
#include <loom/models/causal_lm.hpp>
#include <loom/models/generate.hpp>
#include <loom/optim/adamw.hpp>

#include <fmt/core.h>
#include <torch/optim/adamw.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace fs = std::filesystem;

namespace {

struct options {
  recipes::run_file_arguments run_file;
  std::string tokens;
  std::vector<std::filesystem::path> data, eval_data;
  std::string tokenizer;  // empty: the checkpoint's
  std::string text_field = "text";
  bool chat = false;
  bool skip_malformed = false;
  std::int64_t batch_per_rank = 4;
  std::int64_t seq_len = 128;
  bool merged = false;
  std::vector<std::string> samples;  // prompts to continue with the fine-tuned model
  loom::models::generation_options generation{.max_new_tokens = 40};
};

std::variant<options, int> parse(int argc, char** argv) {
  options parsed;
  CLI::App app{
      "LoRA fine-tuning of a Hugging Face causal language model (Llama, Mistral, Qwen2, Qwen3, Gemma 3) on text "
      "or a token file, from a run file.",
      "lm-finetune"};
  parsed.run_file.add_to(app, /*required=*/true);
  parsed.run_file.add_folders_to(app);
  CLI::Option* tokens = app.add_option("--tokens", parsed.tokens,
                                       "an llm.c token file (dsl_examples/data/make_tokens.py); its last tenth is "
                                       "held out")
                            ->check(CLI::ExistingFile);
  CLI::Option* data = app.add_option("--data", parsed.data,
                                     "JSON Lines or text files, or folders of them, tokenized as they are read "
                                     "(docs/data.md)")
                          ->check(CLI::ExistingPath)
                          ->excludes(tokens);
  app.add_option("--eval-data", parsed.eval_data, "held-out files to evaluate on (none: no evaluation)")
      ->check(CLI::ExistingPath)
      ->needs(data);
  CLI::Option* tokenizer =
      app.add_option("--tokenizer", parsed.tokenizer, "a folder with tokenizer.json (default: the checkpoint's)")
          ->check(CLI::ExistingDirectory);
  CLI::Option* text_field =
      app.add_option("--text-field", parsed.text_field, "the field of a JSON line that holds its text")
          ->capture_default_str()
          ->needs(data);
  app.add_flag("--chat", parsed.chat,
               "read --data as chat records (OpenAI's messages, ShareGPT's conversations, TRL's prompt/completion), "
               "rendered with the checkpoint's chat template, the loss on the assistant's tokens, examples packed "
               "into --seq-len; the run file's \"chat\" object says how (docs/data.md, \"Chat data\")")
      ->needs(data)
      ->excludes(text_field);
  app.add_flag("--skip-malformed", parsed.skip_malformed,
               "skip JSON lines that do not parse or lack the text field (with --chat: records of another shape, or "
               "that the chat template refuses), counting them, instead of stopping")
      ->needs(data);
  app.add_option("--batch-size", parsed.batch_per_rank, "sequences per rank and micro-batch")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  app.add_option("--seq-len", parsed.seq_len, "tokens per sequence")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 24));
  app.add_flag("--merged", parsed.merged, "also write the weights with the adapters merged in, for transformers");
  CLI::Option* sample =
      app.add_option("--sample", parsed.samples,
                     "after training, continue this prompt with the fine-tuned model (loom::models::generate; "
                     "repeat it for more prompts)");
  app.add_option("--max-new-tokens", parsed.generation.max_new_tokens, "tokens --sample adds to its prompt")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20))
      ->needs(sample);
  app.add_option("--temperature", parsed.generation.temperature,
                 "--sample draws the tokens at this temperature (with --top-p), instead of taking the likeliest")
      ->check(CLI::PositiveNumber)
      ->needs(sample);
  app.add_option("--top-p", parsed.generation.top_p,
                 "with --temperature: draw from the likeliest tokens whose "
                 "probabilities sum past this")
      ->check(CLI::Range(0.0, 1.0))
      ->needs(sample);
  if (const auto exit_code = recipes::parse_command_line(app, argc, argv)) return *exit_code;
  parsed.generation.do_sample = app.count("--temperature") > 0;
  if (tokenizer->count() > 0 && parsed.data.empty() && parsed.samples.empty()) {
    fmt::print(stderr, "lm-finetune: --tokenizer is for --data and --sample, and neither is given\n");
    return recipes::usage_exit_code;
  }
  if (parsed.tokens.empty() && parsed.data.empty()) {
    fmt::print(stderr,
               "lm-finetune: give the text to train on: --data FILE.jsonl (with the checkpoint's tokenizer or "
               "--tokenizer DIR) or --tokens FILE.bin\nRun with --help for more information.\n");
    return recipes::usage_exit_code;
  }
  return parsed;
}

// What a run reads: a token file's batches, each a function of its index, or text or chat records
// read as it goes, whose position loom::train keeps; and the held-out batch, if any.
struct run_data {
  std::optional<text_data::batch_sampler> token_batches;
  // On the heap: `text` and `chat` read with them, wherever run_data moves.
  std::unique_ptr<loom::data::tokenizer> tokenizer;
  std::unique_ptr<loom::data::chat_template> chat_template;
  std::unique_ptr<recipes::text_batches> text;
  std::unique_ptr<recipes::chat_batches> chat;
  std::string chat_template_source;  // "the chat template of 'DIR'", as the summary names the template
  recipes::chat_batch held_out;      // ids alone for a token file or text; undefined: no evaluation

  [[nodiscard]] recipes::chat_batch batch(std::int64_t index) {
    if (chat) return chat->next();
    return {.ids = text ? text->next() : token_batches->at_step(index).first, .labels = {}, .positions = {}};
  }
};

// How --chat reads --data: the run file's chat options, the folder whose template is the default, the
// multiple an unpacked micro-batch's length is rounded up to (a sequence group's size), and whether
// this rank prints the data's summary.
struct chat_reading {
  loom::data::chat_options options;
  fs::path tokenizer_folder;
  std::int64_t multiple = 1;
  bool summarize = false;
};

// The tokenizer of --tokenizer or the checkpoint, checked against the checkpoint's vocabulary.
std::unique_ptr<loom::data::tokenizer> read_tokenizer(const options& opts, const fs::path& checkpoint,
                                                      std::int64_t vocab_size) {
  const fs::path folder = opts.tokenizer.empty() ? checkpoint : fs::path(opts.tokenizer);
  if (!fs::exists(folder / "tokenizer.json")) {
    throw std::invalid_argument(
        fmt::format("{} reads text with a tokenizer, and '{}' has no tokenizer.json: give one with --tokenizer DIR",
                    opts.data.empty() ? "--sample" : "--data", folder.string()));
  }
  auto tokenizer = std::make_unique<loom::data::tokenizer>(loom::data::tokenizer::from_pretrained(folder));
  if (tokenizer->vocab_size() > vocab_size) {
    throw std::invalid_argument(fmt::format(
        "the tokenizer in '{}' has {} ids and the checkpoint's vocab_size is {}: give the checkpoint's own tokenizer "
        "(--tokenizer DIR)",
        folder.string(), tokenizer->vocab_size(), vocab_size));
  }
  return tokenizer;
}

// --data read as chat records: the template of the run file's chat.chat_template_path (a Jinja file, or
// a folder of its own), else the tokenizer's folder's (the checkpoint's, or --tokenizer's).
void read_chat(const options& opts, const chat_reading& chat, run_data& data, std::uint64_t seed,
               const loom::data_parallel_place& place) {
  const fs::path& asked = chat.options.chat_template_path;
  if (asked.empty()) {
    data.chat_template =
        std::make_unique<loom::data::chat_template>(loom::data::chat_template::from_pretrained(chat.tokenizer_folder));
    data.chat_template_source = fmt::format("the chat template of '{}'", chat.tokenizer_folder.string());
  } else {
    data.chat_template = std::make_unique<loom::data::chat_template>(
        fs::is_directory(asked) ? loom::data::chat_template::from_pretrained(asked)
                                : loom::data::chat_template::from_pretrained(chat.tokenizer_folder, asked));
    data.chat_template_source = fmt::format("chat.chat_template_path '{}'", asked.string());
  }
  const auto chat_of = [&](const std::vector<fs::path>& paths, bool shuffle, bool summarize) {
    loom::data::chat_dataset_options dataset = chat.options.applied_to({.paths = paths,
                                                                        .seq_len = opts.seq_len,
                                                                        .seed = seed,
                                                                        .shuffle = shuffle,
                                                                        .rank = place.rank,
                                                                        .world_size = place.world_size,
                                                                        .fields_option = "chat.format",
                                                                        .skip_malformed_option = "--skip-malformed"});
    dataset.skip_malformed = dataset.skip_malformed || opts.skip_malformed;
    return std::make_unique<recipes::chat_batches>(
        loom::data::chat_dataset(*data.chat_template, *data.tokenizer, std::move(dataset)), opts.batch_per_rank,
        chat.options.pack, chat.multiple, summarize);
  };
  data.chat = chat_of(opts.data, /*shuffle=*/true, chat.summarize);
  if (!opts.eval_data.empty()) data.held_out = chat_of(opts.eval_data, /*shuffle=*/false, false)->next();
}

run_data read_data(const options& opts, const fs::path& checkpoint, std::int64_t vocab_size, std::uint64_t seed,
                   const loom::data_parallel_place& place, const std::optional<chat_reading>& chat) {
  run_data data;
  if (!opts.data.empty() || !opts.samples.empty()) data.tokenizer = read_tokenizer(opts, checkpoint, vocab_size);
  if (!opts.tokens.empty()) {
    const at::Tensor tokens = token_file::load(opts.tokens, vocab_size);
    const std::int64_t split = tokens.numel() * 9 / 10;
    const std::string knobs = "give a longer token file, a shorter --seq-len or a smaller --batch-size";
    data.token_batches.emplace(tokens.narrow(0, 0, split), seed, place.rank, place.world_size, opts.batch_per_rank,
                               opts.seq_len, fmt::format("the first nine tenths of --tokens '{}'", opts.tokens), knobs);
    data.held_out.ids =
        text_data::batch_sampler(tokens.narrow(0, split, tokens.numel() - split), seed + 1, place.rank,
                                 place.world_size, opts.batch_per_rank, opts.seq_len,
                                 fmt::format("the held-out last tenth of --tokens '{}'", opts.tokens), knobs)
            .at_step(0)
            .first;
    return data;
  }
  const loom::data::tokenizer& tokenizer = *data.tokenizer;
  if (chat) {
    read_chat(opts, *chat, data, seed, place);
    return data;
  }
  const auto text_of = [&](const std::vector<fs::path>& paths, bool shuffle) {
    return std::make_unique<recipes::text_batches>(
        tokenizer,
        loom::data::text_dataset_options{.paths = paths,
                                         .text_field = opts.text_field,
                                         .seq_len = opts.seq_len,
                                         .seed = seed,
                                         .shuffle = shuffle,
                                         .skip_malformed = opts.skip_malformed,
                                         .rank = place.rank,
                                         .world_size = place.world_size,
                                         .text_field_option = "--text-field",
                                         .skip_malformed_option = "--skip-malformed"},
        opts.batch_per_rank);
  };
  data.text = text_of(opts.data, /*shuffle=*/true);
  if (!opts.eval_data.empty()) data.held_out.ids = text_of(opts.eval_data, /*shuffle=*/false)->next();
  return data;
}

// The prompt and what the fine-tuned model adds to it, decoded: every rank generates (under fsdp()
// inside with_whole_module, which gathers the parameters), so that the strategy's collectives meet.
// With a chat template the prompt is a user's message, rendered with the assistant's turn opened, and
// the answer alone is decoded, without its special tokens.
template <class Job>
std::string sample(Job& job, const loom::data::tokenizer& tokenizer, const std::string& prompt,
                   loom::models::generation_options options, const loom::data::chat_template* chat) {
  const std::vector<std::int32_t> ids =
      chat == nullptr
          ? tokenizer.encode(prompt)
          : tokenizer.encode(chat->render(nlohmann::ordered_json::array({{{"role", "user"}, {"content", prompt}}}),
                                          {.add_generation_prompt = true})
                                 .text);
  if (ids.empty()) throw std::invalid_argument("--sample \"\" has no tokens to continue: give a prompt");
  if (options.eos_token_id.empty() && tokenizer.eos_token_id()) options.eos_token_id = {*tokenizer.eos_token_id()};
  const at::Tensor prompt_ids = at::tensor(std::vector<std::int64_t>(ids.begin(), ids.end()), at::kLong);
  const at::Tensor continued = job.with_whole_module([&](loom::models::CausalLM& model) {
    return loom::models::generate(model, prompt_ids.to(job.rt().device()), options);
  });
  const std::int64_t from = chat == nullptr ? 0 : static_cast<std::int64_t>(ids.size());
  const at::Tensor on_host = continued.narrow(0, from, continued.size(0) - from).to(at::kCPU).to(at::kInt).contiguous();
  return tokenizer.decode({on_host.data_ptr<std::int32_t>(), static_cast<std::size_t>(on_host.numel())},
                          /*skip_special_tokens=*/chat != nullptr);
}

// What --chat's records come to on rank 0, an epoch of them rendered, tokenized and packed as the run
// will (docs/data.md, "Chat data"): the examples, their tokens, the share that carries loss, and how
// full the sequences are.
std::string chat_summary(const options& opts, const run_data& data, const loom::train_options& train,
                         const std::string& reads, const std::string& held_out) {
  const loom::data::chat_data_summary& epoch = data.chat->summary().value();
  std::string notes;
  if (epoch.truncated > 0) notes += fmt::format(", {} cut to --seq-len", loom::counted(epoch.truncated, "example"));
  if (epoch.without_loss > 0) {
    notes += fmt::format(", {} left out (no reply within --seq-len)", loom::counted(epoch.without_loss, "record"));
  }
  if (epoch.skipped > 0) notes += fmt::format(", {} skipped", loom::counted(epoch.skipped, "malformed record"));
  const double epochs = static_cast<double>(train.steps * train.accumulate * opts.batch_per_rank) /
                        static_cast<double>(std::max<std::int64_t>(epoch.sequences, 1));
  return fmt::format(
      "data: {} in --data{}, rendered with {}; rank 0's epoch: {}, {} tokens, {:.1f}% of them carrying loss{}; {}\n"
      "data: {}, {:.2f} epochs",
      loom::counted(data.chat->records(), "chat record"), held_out, data.chat_template_source,
      loom::counted(epoch.examples, "example"), epoch.tokens, 100 * epoch.loss_share(), notes,
      data.chat->packed()
          ? fmt::format("packed into {} of {} tokens, {:.1f}% of their tokens the examples' (packing efficiency)",
                        loom::counted(epoch.sequences, "sequence"), epoch.seq_len, 100 * epoch.packing_efficiency())
          : std::string("one example a row, each micro-batch padded to its longest"),
      reads, epochs);
}

// One line on what the run reads: how much data there is against how much the steps take.
std::string data_summary(const options& opts, const run_data& data, const loom::train_options& train,
                         const loom::data_parallel_place& place) {
  const std::int64_t tokens_a_step = opts.batch_per_rank * opts.seq_len * train.accumulate * place.world_size;
  const std::string reads = fmt::format(
      "a step reads {} tokens ({} sequences of {} on each of {}, {} micro-batch{} a step), {} steps {}", tokens_a_step,
      opts.batch_per_rank, opts.seq_len, loom::counted(place.world_size, "data-parallel rank"), train.accumulate,
      train.accumulate == 1 ? "" : "es", train.steps, tokens_a_step * train.steps);
  if (data.token_batches) {
    return fmt::format("data: {} tokens to train on in --tokens '{}' (its last tenth held out); {}, {:.2f} epochs",
                       data.token_batches->tokens(), opts.tokens, reads,
                       data.token_batches->epochs_of(train.steps * train.accumulate));
  }
  const std::string held_out = data.held_out.ids.defined() ? ", --eval-data held out" : "";
  if (data.chat) return chat_summary(opts, data, train, reads, held_out);
  std::uintmax_t bytes = 0;
  for (const fs::path& path : opts.data) {
    std::error_code error;
    if (fs::is_directory(path, error)) {
      for (const auto& entry : fs::recursive_directory_iterator(path, error)) {
        if (entry.is_regular_file(error)) bytes += entry.file_size(error);
      }
    } else {
      bytes += fs::file_size(path, error);
    }
  }
  return fmt::format(
      "data: {} in --data ({:.1f} MiB), tokenized as they are read{}; {} (the end of the run says how "
      "far into the documents it got)",
      loom::counted(data.text->documents(), "document"), static_cast<double>(bytes) / (1 << 20), held_out, reads);
}

int run(const options& opts) {
  // Everything from the files is checked before a process group or a model exists.
  const std::string& config = opts.run_file.config;
  const std::vector<std::string>& overrides = opts.run_file.overrides;
  const loom::run_file file = loom::read_run_file(config, overrides);
  const fs::path checkpoint = recipes::checkpoint_folder(file, config);
  const loom::models::causal_lm_config model_config = loom::models::causal_lm_config::from_pretrained(checkpoint);
  if (opts.seq_len > model_config.max_position_embeddings) {
    throw std::invalid_argument(fmt::format("--seq-len {} is longer than the checkpoint's max_position_embeddings {}",
                                            opts.seq_len, model_config.max_position_embeddings));
  }
  const auto plan = loom::plan_from_file(loom::model<loom::models::CausalLM>(model_config), file);
  const auto seeded = plan.find<loom::seeded_stage>();
  const std::uint64_t seed = seeded ? seeded->seed() : 0;
  // Before the model is built: too little data is a sentence, not a wait for the build.
  const loom::launch_env env = loom::parse_launch_env();
  loom::check_world_size(file, env.world_size);
  if (const auto split = plan.find<loom::sequence_parallel_stage>(); split && opts.seq_len % split->settings().size) {
    const auto k = static_cast<std::int64_t>(split->settings().size);
    throw std::invalid_argument(
        fmt::format("--seq-len {} does not split over sequence_parallel's {} ranks ({}): give --seq-len {}, a "
                    "multiple of {}",
                    opts.seq_len, k, file.sequence_group ? file.sequence_group->asked_by : "the run file's plan",
                    (opts.seq_len / k + 1) * k, k));
  }
  // Under sequence_parallel(k) or tensor_parallel(k) the k ranks of a group read the same batches.
  const loom::data_parallel_place place = loom::data_parallel(plan, env.rank, env.world_size);
  std::optional<chat_reading> chat;
  if (opts.chat) {
    const auto split = plan.find<loom::sequence_parallel_stage>();
    chat = chat_reading{.options = file.chat.value_or(loom::data::chat_options{}),
                        .tokenizer_folder = opts.tokenizer.empty() ? checkpoint : fs::path(opts.tokenizer),
                        .multiple = split ? static_cast<std::int64_t>(split->settings().size) : 1,
                        .summarize = env.rank == 0};
  } else if (file.chat) {
    throw std::invalid_argument(fmt::format(
        "run file '{}' has a \"chat\" object, which says how --chat reads chat records: add --chat to read --data "
        "as chat records, or leave the object out",
        config));
  }
  run_data data = read_data(opts, checkpoint, model_config.vocab_size, seed, place, chat);
  loom::train_options train_options = file.train;
  const std::string folder = recipes::choose_run_folder(train_options, "lm-finetune");
  if (env.rank == 0) fmt::print("{}\n{}\n", folder, data_summary(opts, data, train_options, place));

  auto built = loom::build(plan, loom::runtime::from_env());
  return std::visit(
      [&](auto& job) {
        const loom::runtime& rt = job.rt();
        if (rt.rank() == 0) {
          for (const std::string& note : file.notes) fmt::print("{}\n", note);
          fmt::print("{}\n", job.describe());
        }
        const double peak = train_options.lr ? train_options.lr->peak : 1e-3;
        loom::optim::AdamW optimizer(job.trainable_parameters(), torch::optim::AdamWOptions(peak).weight_decay(0.0));
        // Each rank's share of a micro-batch's tokens: a group of k ranks (sequence_parallel(k),
        // tensor_parallel(k)) shares its sequences, 1/k each.
        train_options.tokens_per_micro_batch = opts.batch_per_rank * opts.seq_len * place.world_size / rt.world_size();
        train_options.name = "lm-finetune";
        // The model's own loss (its forward with labels): the head and the fp32 cross-entropy over
        // chunks of tokens, never every token's logits at once; the sequence group's under sequence_parallel.
        // A token file's or text's ids are their own labels; chat records label the assistant's tokens,
        // and packed ones attend within each example.
        const auto loss_of = [&](const recipes::chat_batch& batch) {
          if (batch.positions.defined()) return job.forward(batch.ids, batch.labels, batch.positions);
          return job.forward(batch.ids, batch.labels.defined() ? batch.labels : batch.ids);
        };
        loom::train_functions functions{.loss = [&](std::int64_t step, int micro) {
          return loss_of(data.batch((step - 1) * train_options.accumulate + micro));
        }};
        if (data.held_out.ids.defined()) {
          functions.eval_loss = [&] { return loss_of(data.held_out); };
        } else if (rt.rank() == 0 && train_options.eval_every > 0) {
          fmt::print("no --eval-data: no evaluation\n");
        }
        if (data.text) {
          functions.data_state = [&] { return data.text->state(); };
          functions.restore_data = [&](const std::string& state) { data.text->restore(state); };
          train_options.data_identity = data.text->identity();
        } else if (data.chat) {
          functions.data_state = [&] { return data.chat->state(); };
          functions.restore_data = [&](const std::string& state) { data.chat->restore(state); };
          train_options.data_identity = data.chat->identity();
        }
        const loom::train_result result = loom::train(job, optimizer, functions, train_options);
        if (data.text && rt.rank() == 0) {
          const auto [epochs, skipped] = data.text->read_so_far(place.world_size);
          fmt::print("data: rank 0 read {:.2f} epochs of its documents{}\n", epochs,
                     skipped > 0 ? fmt::format(", skipping {} malformed lines", skipped) : std::string());
        }
        if (data.chat && rt.rank() == 0) {
          const auto [epochs, skipped] = data.chat->read_so_far();
          fmt::print(
              "data: rank 0 read {:.2f} epochs of its chat records{}\n", epochs,
              skipped > 0 ? fmt::format(", skipping {}", loom::counted(skipped, "malformed record")) : std::string());
        }
        if (result.outcome == loom::train_outcome::preempted) return loom::resumable_exit_code;
        recipes::save_adapter_if_adapted(job, plan, train_options.out / "adapter");
        for (const std::string& prompt : opts.samples) {
          const std::string text = sample(job, *data.tokenizer, prompt, opts.generation, data.chat_template.get());
          if (rt.rank() == 0) fmt::print("sample from \"{}\":\n  {}\n", prompt, text);
        }
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

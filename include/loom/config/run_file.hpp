#pragma once
// Plans from a run file: the stages after the model, chosen without a rebuild, checked with the
// rules and sentences of the compile-time DSL before anything is built (docs/run_files.md).
//
//   {"plan": [{"seeded": 7},
//             {"lora": {"rank": 8, "alpha": 16, "targets": ["q_proj", "v_proj"]}},
//             {"strategy": {"name": "fsdp", "reshard_after_forward": false}}],
//    "train": {"steps": 300, "lr": {"peak": 5e-3, "warmup_steps": 30}, "out": "runs/adapt"}}
//
//   const loom::run_file file = loom::read_run_file("run.json", {"lora.rank=16"});
//   auto plan = loom::plan_from_file(loom::model<TinyGpt>(config), file);
//   std::visit([&](auto& job) { train(job, file.train); }, loom::build(plan, loom::runtime::from_env()));

#include <loom/data/chat_dataset.hpp>
#include <loom/dsl/run_plan.hpp>
#include <loom/train/ema.hpp>
#include <loom/train/euler_sampler.hpp>
#include <loom/train/flow_matching.hpp>
#include <loom/train/loop.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace loom {

// A run file (or an override) that cannot be read: names the file, the key and the accepted form.
class run_file_error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// The number of ranks a run file is written for, and the file's words for it.
struct ranks_asked {
  int ranks = 0;
  std::string asked_by;  // "run file 'x.yaml', line 9: training.distributed: hsdp_replicate_dim 2 × hsdp_shard_dim 2"
  std::string sizes;     // the keys whose value it is: "hsdp_replicate_dim × hsdp_shard_dim"
};

// Where a recipe reads its examples, and how many, from a run file's "data" object (FastVideo's
// training.data: data_path, train_batch_size); what it leaves out is the program's (--data,
// --batch-size).
struct run_data_options {
  std::optional<std::filesystem::path> path;
  std::optional<std::int64_t> batch_size;  // examples per rank and micro-batch

  static constexpr auto fields() {
    return std::tuple{option_field{"path", &run_data_options::path},
                      option_field{"batch_size", &run_data_options::batch_size}};
  }
  [[nodiscard]] std::optional<option_problem> problem() const;
};

// AdamW's options beside its rate (the rate is train.lr's), from a run file's "optimizer" object
// (FastVideo's training.optimizer: betas, weight_decay). The defaults are torch's AdamW's, but for
// weight_decay, 0 as FastVideo's unless it is asked for.
struct adamw_run_options {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;

  static constexpr auto fields() {
    return std::tuple{option_field{"beta1", &adamw_run_options::beta1},
                      option_field{"beta2", &adamw_run_options::beta2}, option_field{"eps", &adamw_run_options::eps},
                      option_field{"weight_decay", &adamw_run_options::weight_decay}};
  }
  [[nodiscard]] std::optional<option_problem> problem() const;
};

// A run file read once (TOML, JSON or YAML, by its extension; YAML also in FastVideo's layout,
// docs/run_files.md): the stages of its "plan" list, in order, the loop's options of its "train"
// object, and a flow-matching recipe's options of its "flow_matching" object, with `overrides`
// applied on top, in order: "lora.rank=16", "strategy=fsdp", "strategy.bucket_cap_mb=50", "seeded=7"
// to the stages, "train.steps=100", "train.lr.peak=3e-4" to the loop, "flow_matching.flow_shift=5"
// to flow matching, "ema.decay=0.999" to the weights' average, "sampling.guidance_scale=5" to the
// sampler, "chat.packing=false" to chat data. Unknown keys, wrong types and a strategy loom does not have are
// run_file_errors; a stage's value out of range is the DSL's plan_error with its rule's sentence,
// and a loop's option that train() would refuse is a run_file_error now, before anything is built.
struct run_file {
  run_stages stages;
  train_options train;
  std::optional<flow_matching_options> flow_matching;
  // A moving average of the trained weights (loom::ema), from the file's "ema" object.
  std::optional<ema_options> ema;
  // How a flow-matching recipe samples at each evaluation (loom::flow_euler_sampler), from the file's
  // "sampling" object.
  std::optional<flow_euler_sampler_options> sampling;
  // The recipe's data, from the file's "data" object.
  std::optional<run_data_options> data;
  // AdamW's betas, eps and weight decay, from the file's "optimizer" object.
  std::optional<adamw_run_options> optimizer;
  // How an instruction-tuning recipe reads its chat records, from the file's "chat" object (lm-finetune --chat).
  std::optional<data::chat_options> chat;
  // The ranks the file is written for, when it says (FastVideo's hsdp_replicate_dim × hsdp_shard_dim,
  // or num_gpus): check_world_size compares them with the job's.
  std::optional<ranks_asked> ranks;
  // sequence_parallel's group size, k > 1, which the job's ranks must be a multiple of (`sizes`
  // names its key): check_world_size checks it.
  std::optional<ranks_asked> sequence_group;
  // tensor_parallel's group size, k > 1, checked as sequence_group is.
  std::optional<ranks_asked> tensor_group;
  // What the reader accepted but a user should hear about once (a FastVideo LoRA block with enable:
  // false), for the program to print on one rank.
  std::vector<std::string> notes;
};

// Throws run_file_error when the file is written for another number of ranks than `world_size`, or
// splits each sequence or each layer over a group of ranks that does not divide it, in one sentence
// naming the keys that say so; a program calls it once it knows the world's size
// (loom::parse_launch_env()), before it builds anything.
void check_world_size(const run_file& file, int world_size);

[[nodiscard]] run_file read_run_file(const std::filesystem::path& path, std::span<const std::string> overrides = {});

// Its stages alone, or its loop's options alone (each reads the file).
[[nodiscard]] run_stages read_run_stages(const std::filesystem::path& path,
                                         std::span<const std::string> overrides = {});
[[nodiscard]] train_options read_train_options(const std::filesystem::path& path,
                                               std::span<const std::string> overrides = {});

// The model's plan with the file's stages after it; the order rules are checked here (plan_error).
template <class Model>
[[nodiscard]] run_plan<Model> plan_from_file(const plan<Model>& model, const run_file& file) {
  return run_plan<Model>(model, file.stages);
}
template <class Model>
[[nodiscard]] run_plan<Model> plan_from_file(const plan<Model>& model, const std::filesystem::path& path,
                                             std::span<const std::string> overrides = {}) {
  return run_plan<Model>(model, read_run_stages(path, overrides));
}

}  // namespace loom

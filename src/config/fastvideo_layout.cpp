#include "fastvideo_layout.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::config_detail {
namespace {

using json = nlohmann::ordered_json;

// The value at dotted `to` in loom's tree ("train.lr.peak"), its objects made on the way; `from` is
// the FastVideo key it comes from, whose line it keeps and whose name messages use. A key the file
// also gives in loom's spelling is refused: one of them would be silently lost.
void map_key(json& root, const std::string& to, json value, const std::string& from, fastvideo_reader& reader) {
  json* at = &root;
  for (std::size_t start = 0;;) {
    const auto dot = to.find('.', start);
    const std::string part = to.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (at->is_null()) *at = json::object();
    if (!at->is_object()) reader.fail(from, fmt::format("sets {}, which the file gives as something else", to));
    at = &(*at)[part];
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  if (!at->is_null()) reader.fail(from, fmt::format("sets {}, which the file gives too: give it once", to));
  *at = std::move(value);
  reader.move_lines(from, to);
}

// A FastVideo value as a note shows it: "fastvideo", 4, [0.9, 0.999].
std::string shown(const json& value) { return value.is_string() ? value.get<std::string>() : value.dump(); }

// A callback's or method's _target_, if given, must be the class loom does the work of.
void check_target(const json& block, const std::string& at, std::string_view expected, const std::string& instead,
                  fastvideo_reader& reader) {
  if (!block.contains("_target_")) return;
  const json& target = block["_target_"];
  const std::string name = target.is_string() ? target.get<std::string>() : "";
  if (!name.ends_with(expected))
    reader.fail(at + "._target_", fmt::format("is {}; {}", target.is_string() ? name : target.dump(), instead));
}

// One plan stage of the translation, and the stages it must come before (the order rules').
struct added_stage {
  json stage;
  std::vector<std::string> later;
};

// FastVideo's gradient checkpointing: "full" recomputes every block, as loom's recompute stage does.
std::optional<added_stage> recompute_of(const json& value, const std::string& key, fastvideo_reader& reader) {
  if (value.is_null() || value == "none" || value == "") return std::nullopt;
  if (value != "full")
    reader.fail(key, fmt::format("is {}; loom recomputes whole blocks: give full, or null for none", shown(value)));
  reader.move_lines(key, "recompute");
  return added_stage{json{{"recompute", json::object()}},
                     {"sequence_parallel", "tensor_parallel", "lora", "trainable", "strategy"}};
}

// The lora stage of `models`' one LoRA block that is enabled, if any; a role's flow_shift goes to
// `flow_matching`.
// What models.<role> gives beside its LoRA block: the checkpoint (init_from) and gradient checkpointing.
struct fastvideo_role {
  std::optional<added_stage> pretrained;
  std::optional<added_stage> recompute;
};

std::optional<json> fastvideo_models(const json& models, json& flow_matching, fastvideo_role& found,
                                     fastvideo_reader& reader) {
  if (!models.is_object())
    reader.fail("models", "give each model's role as a key, e.g. models: {transformer: {lora: ...}}");
  std::optional<json> stage;
  std::string enabled_role, shifted_role, loaded_role;
  for (const auto& [role, model] : models.items()) {
    const std::string where = "models." + role;
    if (!model.is_object())
      reader.fail(where, "give the role's settings as an object, e.g. {lora: {enable: true, rank: 8}}");
    reader.require_keys(where,
                        {"_target_", "init_from", "trainable", "lora", "flow_shift", "disable_custom_init_weights",
                         "enable_gradient_checkpointing_type", "transformer_override_safetensor", "attention_backend"},
                        model, where);
    if (model.contains("_target_")) {
      reader.note(
          fmt::format("{}._target_ ({}) is not read: the program builds its model from the checkpoint's "
                      "config.json",
                      where, shown(model["_target_"])));
    }
    if (model.contains("init_from")) {
      // FastVideo's teacher and critic roles load models of their own, for distillation.
      if (!loaded_role.empty()) {
        reader.fail(where + ".init_from", fmt::format("models.{} has one too; loom trains one model (no teacher or "
                                                      "critic): give init_from for one role",
                                                      loaded_role));
      }
      loaded_role = role;
      const json& from = model["init_from"];
      if (!from.is_string() || from.get<std::string>().empty())
        reader.fail(where + ".init_from", "give the checkpoint's folder (its config.json and weights) as a string");
      reader.move_lines(where + ".init_from", "pretrained");
      found.pretrained = added_stage{json{{"pretrained", from}},
                                     {"quantized", "quantization_config", "mixed_precision", "recompute",
                                      "sequence_parallel", "tensor_parallel", "lora", "trainable", "strategy"}};
    }
    if (model.contains("trainable") && !reader.boolean(where + ".trainable", model["trainable"])) {
      reader.fail(where + ".trainable",
                  "is false; loom trains the model it loads (a frozen role is a distillation teacher's): give true");
    }
    if (model.contains("disable_custom_init_weights")) {
      reader.boolean(where + ".disable_custom_init_weights", model["disable_custom_init_weights"]);
      reader.note(
          fmt::format("{}.disable_custom_init_weights is not read: loom loads every weight from the "
                      "checkpoint and initialises only LoRA's adapters",
                      where));
    }
    if (model.contains("enable_gradient_checkpointing_type")) {
      found.recompute = recompute_of(model["enable_gradient_checkpointing_type"],
                                     where + ".enable_gradient_checkpointing_type", reader);
    }
    if (model.contains("transformer_override_safetensor") && !model["transformer_override_safetensor"].is_null()) {
      reader.fail(where + ".transformer_override_safetensor",
                  "loom loads the weights of init_from's folder alone: put the override's weights in a checkpoint "
                  "folder of their own and give it as init_from");
    }
    if (model.contains("attention_backend") && !model["attention_backend"].is_null()) {
      reader.note(
          fmt::format("{}.attention_backend ({}) is not read: loom's attention is PyTorch's "
                      "scaled_dot_product_attention, which picks its kernel itself",
                      where, shown(model["attention_backend"])));
    }
    if (model.contains("flow_shift")) {
      if (!shifted_role.empty()) {
        reader.fail(
            where + ".flow_shift",
            fmt::format("models.{} has one too; loom trains one model: give flow_shift for one role", shifted_role));
      }
      shifted_role = role;
      flow_matching["flow_shift"] = model["flow_shift"];
      reader.move_lines(where + ".flow_shift", "flow_matching.flow_shift");
    }
    if (!model.contains("lora")) continue;
    const json& block = model["lora"];
    const std::string at = where + ".lora";
    if (!block.is_object())
      reader.fail(at, "give {enable: true, rank: 8, alpha: 16, target_modules: [q_proj, v_proj]}");
    reader.require_keys(at, {"enable", "rank", "alpha", "target_modules"}, block, at);
    const bool enable = block.contains("enable") && reader.boolean(at + ".enable", block["enable"]);
    if (!enable) {
      reader.note(
          fmt::format("{}.enable is {}: no LoRA is applied{}", at, block.contains("enable") ? "false" : "not set",
                      block.contains("rank") ? fmt::format(" (its rank {} is not used)", block["rank"].dump()) : ""));
      continue;
    }
    if (!enabled_role.empty()) {
      reader.fail(at, fmt::format("LoRA is enabled for models.{} too; loom trains one model: enable it for one role",
                                  enabled_role));
    }
    enabled_role = role;
    if (!block.contains("rank")) reader.fail(at, "rank is missing; enable: true needs the adapters' rank, e.g. 8");
    json lora = json::object();
    lora["rank"] = block["rank"];
    if (block.contains("alpha")) lora["alpha"] = block["alpha"];  // else the rank's, as loom's default is
    if (block.contains("target_modules")) lora["targets"] = block["target_modules"];
    reader.move_lines(at, "lora");
    reader.move_lines("lora.target_modules", "lora.targets");
    stage = json{{"lora", std::move(lora)}};
  }
  return stage;
}

// FastVideo's parallel sizes, as loom has them. `fallback` is the size a key left out takes.
class distributed_sizes {
 public:
  distributed_sizes(const json& distributed, fastvideo_reader& reader) : distributed_(distributed), reader_(reader) {}

  [[nodiscard]] bool has(const char* key) const { return distributed_.contains(key); }
  // A positive whole number, or -1 where FastVideo reads it as "every GPU".
  [[nodiscard]] std::int64_t size(const char* key, std::int64_t fallback, bool every_gpu_allowed = false) const {
    if (!has(key)) return fallback;
    const json& value = distributed_[key];
    const bool whole = value.is_number_integer();
    const std::int64_t size = whole ? value.get<std::int64_t>() : 0;
    if (!whole || size > std::numeric_limits<int>::max() || (size < 1 && !(every_gpu_allowed && size == -1))) {
      reader_.fail(key_of(key), every_gpu_allowed ? "give a whole number of GPUs, or -1 for all of them"
                                                  : "give a whole number of GPUs, 1 or more");
    }
    return size;
  }
  [[nodiscard]] static std::string key_of(const char* key) { return std::string("training.distributed.") + key; }

 private:
  const json& distributed_;
  fastvideo_reader& reader_;
};

// The plan's stages that training.distributed gives, each a plan entry.
struct distributed_stages {
  std::optional<json> sequence_parallel;
  std::optional<json> tensor_parallel;
  std::optional<json> strategy;
};

// training.distributed as the plan's stages: sp_size as sequence_parallel, tp_size as tensor_parallel,
// its strategy, FastVideo's hybrid sharding (hsdp_replicate_dim copies of the model, each sharded
// across hsdp_shard_dim ranks) as fsdp's shard_group_size, and the ranks the file is written for.
distributed_stages fastvideo_distributed(const json& distributed, fastvideo_reader& reader) {
  const std::string at = "training.distributed";
  if (!distributed.is_object()) reader.fail(at, "give {strategy: fsdp, hsdp_replicate_dim: 1, hsdp_shard_dim: 2}");
  reader.require_keys(
      at, {"strategy", "num_gpus", "hsdp_replicate_dim", "hsdp_shard_dim", "sp_size", "tp_size", "pin_cpu_memory"},
      distributed, at);
  // pin_cpu_memory pins host copies for FastVideo's CPU offload; it changes no result.
  if (distributed.contains("pin_cpu_memory")) {
    reader.boolean(at + ".pin_cpu_memory", distributed["pin_cpu_memory"]);
    reader.note(at +
                ".pin_cpu_memory is not read: loom offloads only under the fsdp strategy's offload option, "
                "which pins its host copies itself");
  }
  const distributed_sizes sizes(distributed, reader);
  const std::int64_t gpus = sizes.size("num_gpus", 1);
  distributed_stages stages;
  // FastVideo's tp_size -1, like 1, splits no layer.
  const std::int64_t tp = std::max<std::int64_t>(sizes.size("tp_size", 1, true), 1);
  // FastVideo reads a missing sp_size, or -1, as num_gpus: sequence parallelism over every GPU. Under a
  // tp_size above 1 a missing one is 1, as one mesh of ranks does not split both ways yet (R22).
  std::int64_t sp = sizes.size("sp_size", tp > 1 ? 1 : gpus, true);
  if (sp == -1) sp = gpus;
  if (sizes.has("num_gpus") && gpus % sp != 0) {
    reader.fail(distributed_sizes::key_of("sp_size"),
                fmt::format("is {}, which does not divide num_gpus {}: give a divisor of it (each sequence is split "
                            "across sp_size of the ranks)",
                            sp, gpus));
  }
  if (sp != 1) {
    stages.sequence_parallel = json{{"sequence_parallel", json{{"size", static_cast<std::uint64_t>(sp)}}}};
    if (sizes.has("sp_size")) reader.move_lines(distributed_sizes::key_of("sp_size"), "sequence_parallel.size");
  }
  if (sizes.has("num_gpus") && gpus % tp != 0) {
    reader.fail(distributed_sizes::key_of("tp_size"),
                fmt::format("is {}, which does not divide num_gpus {}: give a divisor of it (each layer is split "
                            "across tp_size of the ranks)",
                            tp, gpus));
  }
  if (tp != 1) {
    stages.tensor_parallel = json{{"tensor_parallel", json{{"size", static_cast<std::uint64_t>(tp)}}}};
    reader.move_lines(distributed_sizes::key_of("tp_size"), "tensor_parallel.size");
  }
  const std::int64_t replicas = sizes.size("hsdp_replicate_dim", 1);
  const std::int64_t shard = sizes.size("hsdp_shard_dim", -1, true);
  const bool hybrid = sizes.has("hsdp_replicate_dim") || sizes.has("hsdp_shard_dim");
  if (replicas > 1 && shard == -1) {
    reader.fail(distributed_sizes::key_of("hsdp_replicate_dim"),
                fmt::format("is {} without hsdp_shard_dim: give hsdp_shard_dim too, the ranks each of the {} copies "
                            "of the model is sharded across",
                            replicas, replicas));
  }
  if (shard != -1) {
    const std::int64_t ranks = replicas * shard;  // each below 2^31: no overflow
    if (ranks > std::numeric_limits<int>::max()) {
      reader.fail(at, fmt::format("hsdp_replicate_dim {} × hsdp_shard_dim {} is more ranks than a job can have",
                                  replicas, shard));
    }
    if (sizes.has("num_gpus") && gpus != ranks) {
      reader.fail(at, fmt::format("hsdp_replicate_dim {} × hsdp_shard_dim {} is {} ranks, but num_gpus is {}: give "
                                  "sizes whose product is num_gpus",
                                  replicas, shard, ranks, gpus));
    }
    reader.require_ranks(static_cast<int>(ranks), at,
                         fmt::format("hsdp_replicate_dim {} × hsdp_shard_dim {}", replicas, shard),
                         "hsdp_replicate_dim × hsdp_shard_dim");
  } else if (sizes.has("num_gpus")) {
    reader.require_ranks(static_cast<int>(gpus), distributed_sizes::key_of("num_gpus"),
                         fmt::format("num_gpus {}", gpus), "num_gpus");
  }

  json strategy = distributed.contains("strategy") ? distributed["strategy"] : json();
  if (hybrid) {
    if (strategy.is_null()) strategy = "fsdp";  // FastVideo shards with FSDP
    if (strategy.is_string()) strategy = json{{"name", strategy}};
    std::string name = strategy.is_object() && strategy.contains("name") && strategy["name"].is_string()
                           ? strategy["name"].get<std::string>()
                           : "";
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    if (name != "fsdp") {
      reader.fail(distributed_sizes::key_of("strategy"),
                  fmt::format("is {}, but hsdp_replicate_dim and hsdp_shard_dim shard the model, as fsdp does: give "
                              "strategy: fsdp, or leave the hsdp keys out",
                              name.empty() ? "no strategy's name" : name));
    }
    if (strategy.contains("shard_group_size")) {
      reader.fail(distributed_sizes::key_of("strategy.shard_group_size"),
                  "is given with hsdp_shard_dim, which sets it: give one of them");
    }
    strategy["shard_group_size"] = shard == -1 ? 0 : shard;  // fsdp's 0: every rank
  }
  if (strategy.is_null()) return stages;
  reader.move_lines(distributed_sizes::key_of("strategy"), "strategy");
  stages.strategy = json{{"strategy", std::move(strategy)}};
  return stages;
}

// training.data: the recipe's data ("data"), the seed (the plan's seeded stage), and the share of
// captions dropped for classifier-free guidance (flow matching's training_cfg_rate).
std::optional<added_stage> fastvideo_data(const json& data, json& root, json& flow_matching, fastvideo_reader& reader) {
  const std::string at = "training.data";
  if (!data.is_object()) reader.fail(at, "give {data_path: data/preprocessed, train_batch_size: 1}");
  reader.require_keys(at,
                      {"data_path", "preprocessed_data_type", "train_batch_size", "dataloader_num_workers",
                       "training_cfg_rate", "seed", "num_height", "num_width", "num_latent_t", "num_frames"},
                      data, at);
  if (data.contains("data_path")) {
    // FastVideo also mixes datasets ("a:2,b", a list, {path: repeat}); a recipe reads one folder.
    const json& path = data["data_path"];
    const std::string text = path.is_string() ? path.get<std::string>() : "";
    if (text.empty() || text.find(',') != std::string::npos)
      reader.fail(at + ".data_path", "give one folder of preprocessed clips, as a string (loom mixes no datasets)");
    map_key(root, "data.path", path, at + ".data_path", reader);
  }
  if (data.contains("train_batch_size"))
    map_key(root, "data.batch_size", data["train_batch_size"], at + ".train_batch_size", reader);
  if (data.contains("training_cfg_rate")) {
    if (flow_matching.contains("training_cfg_rate"))
      reader.fail(at + ".training_cfg_rate", "training.model gives it too: give it once");
    flow_matching["training_cfg_rate"] = data["training_cfg_rate"];
    reader.move_lines(at + ".training_cfg_rate", "flow_matching.training_cfg_rate");
  }
  if (data.contains("preprocessed_data_type") && data["preprocessed_data_type"] != "t2v") {
    reader.fail(at + ".preprocessed_data_type",
                fmt::format("is {}; loom trains text-to-video on precomputed latents and text states: give t2v",
                            shown(data["preprocessed_data_type"])));
  }
  if (data.contains("dataloader_num_workers")) {
    reader.note(
        fmt::format("{}.dataloader_num_workers ({}) is not read: loom reads the clips on its own "
                    "background thread",
                    at, shown(data["dataloader_num_workers"])));
  }
  std::vector<std::string> sizes;
  for (const char* key : {"num_latent_t", "num_height", "num_width", "num_frames"})
    if (data.contains(key)) sizes.emplace_back(key);
  if (!sizes.empty()) {
    reader.note(fmt::format("{}.{} not read: loom takes each clip's size from its latents", at,
                            fmt::format("{} {}", fmt::join(sizes, ", "), sizes.size() == 1 ? "is" : "are")));
  }
  if (!data.contains("seed")) return std::nullopt;
  reader.move_lines(at + ".seed", "seeded");
  return added_stage{json{{"seeded", data["seed"]}},
                     {"default_dtype", "pretrained", "quantized", "quantization_config", "mixed_precision", "recompute",
                      "sequence_parallel", "tensor_parallel", "lora", "trainable", "strategy"}};
}

// The number of steps a FastVideo schedule decays over: the run's, as training.loop or train gives it.
std::int64_t run_steps(const json& root, const json& loop, const std::string& key, fastvideo_reader& reader) {
  const json* steps = nullptr;
  if (loop.is_object() && loop.contains("max_train_steps"))
    steps = &loop["max_train_steps"];
  else if (root.contains("train") && root["train"].is_object() && root["train"].contains("steps"))
    steps = &root["train"]["steps"];
  if (steps == nullptr || !steps->is_number_integer())
    reader.fail(key, "decays over the run, whose length is missing: give training.loop.max_train_steps");
  return steps->get<std::int64_t>();
}

// training.optimizer: the rate and its schedule (train.lr) and AdamW's other options ("optimizer").
void fastvideo_optimizer(const json& optimizer, const json& loop, json& root, fastvideo_reader& reader) {
  const std::string at = "training.optimizer";
  if (!optimizer.is_object()) reader.fail(at, "give {learning_rate: 1.0e-5, betas: [0.9, 0.999], weight_decay: 0.01}");
  reader.require_keys(at,
                      {"learning_rate", "betas", "weight_decay", "lr_scheduler", "lr_warmup_steps", "lr_num_cycles",
                       "lr_power", "min_lr_ratio"},
                      optimizer, at);
  if (optimizer.contains("betas")) {
    // A list, or FastVideo's string form "0.9,0.999".
    json betas = optimizer["betas"];
    if (betas.is_string()) {
      const std::string text = betas.get<std::string>();
      const json parsed = json::parse("[" + text + "]", nullptr, /*allow_exceptions=*/false);
      if (!parsed.is_discarded()) betas = parsed;
    }
    // Checked here, where the key has its line: the two become two keys of loom's.
    const auto beta = [](const json& value) {
      return value.is_number() && value.get<double>() >= 0.0 && value.get<double>() < 1.0;
    };
    if (!betas.is_array() || betas.size() != 2 || !beta(betas[0]) || !beta(betas[1]))
      reader.fail(at + ".betas", fmt::format("is {}; give AdamW's two betas, each in [0, 1), e.g. [0.9, 0.999]",
                                             optimizer["betas"].dump()));
    map_key(root, "optimizer.beta1", betas[0], at + ".betas", reader);
    map_key(root, "optimizer.beta2", betas[1], at + ".betas", reader);
  }
  if (optimizer.contains("weight_decay"))
    map_key(root, "optimizer.weight_decay", optimizer["weight_decay"], at + ".weight_decay", reader);
  if (!optimizer.contains("learning_rate")) {
    if (optimizer.contains("lr_scheduler") || optimizer.contains("lr_warmup_steps"))
      reader.fail(at, "has a schedule but no learning_rate: give learning_rate, the schedule's peak");
    return;
  }
  json lr = json{{"peak", optimizer["learning_rate"]}};
  const std::string scheduler = optimizer.contains("lr_scheduler") && optimizer["lr_scheduler"].is_string()
                                    ? optimizer["lr_scheduler"].get<std::string>()
                                : optimizer.contains("lr_scheduler") ? ""
                                                                     : "constant";
  const json warmup = optimizer.contains("lr_warmup_steps") ? optimizer["lr_warmup_steps"] : json(0);
  if (!warmup.is_number_integer() || warmup.get<std::int64_t>() < 0)
    reader.fail(at + ".lr_warmup_steps", "give a whole number of steps, 0 or more");
  const std::int64_t warmup_steps = warmup.get<std::int64_t>();
  if (scheduler == "constant") {
    // FastVideo's constant schedule has no warmup, whatever lr_warmup_steps says.
    if (warmup_steps > 0) {
      reader.note(
          fmt::format("{}.lr_warmup_steps ({}) is not used under lr_scheduler constant, as in FastVideo: "
                      "give constant_with_warmup for a warmup",
                      at, warmup_steps));
    }
  } else if (scheduler == "constant_with_warmup" || scheduler == "linear" || scheduler == "cosine") {
    lr["warmup_steps"] = warmup_steps;
    if (scheduler != "constant_with_warmup") {
      // From the end of the warmup to zero at the last step, as FastVideo's (diffusers') schedules.
      const std::int64_t steps = run_steps(root, loop, at + ".lr_scheduler", reader);
      lr["decay_steps"] = std::max<std::int64_t>(steps - warmup_steps, 0);
      lr["decay"] = scheduler;
    }
  } else {
    reader.fail(at + ".lr_scheduler",
                fmt::format("is {}; loom's schedule is a warmup, then a linear or cosine decay: give constant, "
                            "constant_with_warmup, linear or cosine (or write train.lr in loom's layout)",
                            optimizer["lr_scheduler"].dump()));
  }
  // lr_num_cycles, lr_power and min_lr_ratio are read by the schedules refused above alone, in FastVideo too.
  map_key(root, "train.lr.peak", optimizer["learning_rate"], at + ".learning_rate", reader);
  for (auto& item : lr.items())
    if (item.key() != "peak") root["train"]["lr"][item.key()] = std::move(item.value());
  if (optimizer.contains("lr_scheduler")) reader.move_lines(at + ".lr_scheduler", "train.lr.decay");
  if (optimizer.contains("lr_warmup_steps")) reader.move_lines(at + ".lr_warmup_steps", "train.lr.warmup_steps");
}

// training.checkpoint: the run's folder and how often, and how many, checkpoints are kept.
void fastvideo_checkpoint(const json& checkpoint, json& root, fastvideo_reader& reader) {
  const std::string at = "training.checkpoint";
  if (!checkpoint.is_object())
    reader.fail(at, "give {output_dir: outputs/run, training_state_checkpointing_steps: 100}");
  reader.require_keys(
      at, {"output_dir", "resume_from_checkpoint", "training_state_checkpointing_steps", "checkpoints_total_limit"},
      checkpoint, at);
  if (checkpoint.contains("output_dir"))
    map_key(root, "train.out", checkpoint["output_dir"], at + ".output_dir", reader);
  if (checkpoint.contains("training_state_checkpointing_steps")) {
    map_key(root, "train.checkpoint_every", checkpoint["training_state_checkpointing_steps"],
            at + ".training_state_checkpointing_steps", reader);
  }
  if (checkpoint.contains("checkpoints_total_limit")) {
    if (checkpoint["checkpoints_total_limit"] == 0) {
      reader.fail(at + ".checkpoints_total_limit",
                  "is 0, FastVideo's \"keep them all\"; loom keeps a bounded number: give how many to keep, 1 or more");
    }
    map_key(root, "train.keep_checkpoints", checkpoint["checkpoints_total_limit"], at + ".checkpoints_total_limit",
            reader);
  }
  if (!checkpoint.contains("resume_from_checkpoint")) return;
  const json& resume = checkpoint["resume_from_checkpoint"];
  if (resume == "latest") return;  // what loom does
  if (resume.is_null() || resume == "") {
    reader.note(
        fmt::format("{}.resume_from_checkpoint is {}, but loom resumes from the latest checkpoint in "
                    "output_dir when it has one: give a new output_dir to start afresh",
                    at, resume.is_null() ? "null" : "empty"));
    return;
  }
  reader.fail(at + ".resume_from_checkpoint",
              fmt::format("is {}; loom resumes from the latest checkpoint in output_dir: give latest (or null), and "
                          "the run's folder as output_dir",
                          shown(resume)));
}

// callbacks: gradient clipping (train.clip_norm), the weights' average ("ema") and validation
// (train.eval_every and the sampler's options, "sampling").
void fastvideo_callbacks(const json& callbacks, json& root, fastvideo_reader& reader) {
  if (!callbacks.is_object())
    reader.fail("callbacks", "give each callback by its name: {grad_clip: {max_grad_norm: 1.0}}");
  reader.require_keys("callbacks", {"grad_clip", "ema", "validation"}, callbacks, "callbacks");
  if (callbacks.contains("grad_clip")) {
    const std::string at = "callbacks.grad_clip";
    const json& clip = callbacks["grad_clip"];
    if (!clip.is_object()) reader.fail(at, "give {max_grad_norm: 1.0}");
    reader.require_keys(at, {"_target_", "max_grad_norm", "log_grad_norms"}, clip, at);
    check_target(clip, at, "GradNormClipCallback", "loom clips the gradients' norm itself: give GradNormClipCallback",
                 reader);
    // FastVideo's default is 1.0; 0 (or less) clips nothing, as loom's none.
    const json norm = clip.contains("max_grad_norm") ? clip["max_grad_norm"] : json(1.0);
    if (!norm.is_number())
      reader.fail(at + ".max_grad_norm", "give the largest gradient norm, e.g. 1.0 (0: no clipping)");
    map_key(root, "train.clip_norm", norm.get<double>() > 0 ? norm : json(), at + ".max_grad_norm", reader);
    if (clip.contains("log_grad_norms")) reader.boolean(at + ".log_grad_norms", clip["log_grad_norms"]);
    // loom logs the norm at every clip: log_grad_norms has nothing to add.
  }
  if (callbacks.contains("ema")) {
    const std::string at = "callbacks.ema";
    const json& ema = callbacks["ema"];
    if (!ema.is_object()) reader.fail(at, "give {decay: 0.9999, start_iter: 0}");
    reader.require_keys(at, {"_target_", "decay", "start_iter"}, ema, at);
    check_target(ema, at, "EMACallback", "loom keeps the average itself: give EMACallback", reader);
    json options = json::object();  // an ema: {} keeps loom's defaults, FastVideo's
    if (ema.contains("decay")) options["decay"] = ema["decay"];
    if (ema.contains("start_iter")) options["start_step"] = ema["start_iter"];
    map_key(root, "ema", std::move(options), at, reader);
    reader.move_lines("ema.start_iter", "ema.start_step");
  }
  if (callbacks.contains("validation")) {
    const std::string at = "callbacks.validation";
    const json& validation = callbacks["validation"];
    if (!validation.is_object()) reader.fail(at, "give {every_steps: 100, sampling_steps: [50], guidance_scale: 5.0}");
    reader.require_keys(at,
                        {"_target_", "pipeline_target", "dataset_file", "every_steps", "sampling_steps",
                         "guidance_scale", "num_frames", "output_dir", "sampling_timesteps", "run_at_start"},
                        validation, at);
    check_target(validation, at, "ValidationCallback", "loom validates itself: give ValidationCallback", reader);
    // FastVideo's default period is 100 steps; 0 validates never, as loom's 0.
    map_key(root, "train.eval_every", validation.contains("every_steps") ? validation["every_steps"] : json(100),
            at + ".every_steps", reader);
    json sampling = json::object();
    if (validation.contains("sampling_steps")) {
      const json& steps = validation["sampling_steps"];
      if (!steps.is_array() || steps.size() != 1)
        reader.fail(at + ".sampling_steps", "give one number of sampling steps, as a list: [50]");
      sampling["num_inference_steps"] = steps[0];
    } else {
      sampling["num_inference_steps"] = 40;  // FastVideo's default
    }
    if (validation.contains("guidance_scale") && !validation["guidance_scale"].is_null())
      sampling["guidance_scale"] = validation["guidance_scale"];
    map_key(root, "sampling", std::move(sampling), at, reader);
    reader.move_lines("sampling.sampling_steps", "sampling.num_inference_steps");
    if (validation.contains("sampling_timesteps") && !validation["sampling_timesteps"].is_null()) {
      reader.fail(at + ".sampling_timesteps",
                  "loom's sampler spaces its steps as diffusers' Euler scheduler does: give sampling_steps alone");
    }
    std::vector<std::string> unused;
    for (const char* key : {"pipeline_target", "dataset_file", "num_frames", "output_dir", "run_at_start"})
      if (validation.contains(key) && !validation[key].is_null()) unused.emplace_back(key);
    if (!unused.empty()) {
      reader.note(
          fmt::format("{}: {} not read: loom validates on the held-out clips, sampling from their text "
                      "states with its Euler sampler (not the pipeline's UniPC from the prompts' file), "
                      "and logs the loss of each to metrics.jsonl",
                      at, fmt::format("{} {}", fmt::join(unused, ", "), unused.size() == 1 ? "is" : "are")));
    }
  }
}

// The training keys of FastVideo's that loom reads without effect, or refuses.
void fastvideo_training_rest(json& training, fastvideo_reader& reader) {
  if (training.contains("tracker")) {
    const json& tracker = training["tracker"];
    if (!tracker.is_object()) reader.fail("training.tracker", "give {project_name: fastvideo, run_name: my_run}");
    reader.require_keys("training.tracker", {"trackers", "project_name", "run_name", "entity"}, tracker,
                        "training.tracker");
    reader.note(
        "training.tracker is not read: loom has no wandb tracker; it writes the metrics to "
        "metrics.jsonl in output_dir");
    training.erase("tracker");
  }
  if (training.contains("vsa")) {
    const json& vsa = training["vsa"];
    if (!vsa.is_object()) reader.fail("training.vsa", "give {sparsity: 0.0}");
    reader.require_keys("training.vsa", {"sparsity", "cache_tile_buf"}, vsa, "training.vsa");
    if (vsa.contains("sparsity") && !(vsa["sparsity"].is_number() && vsa["sparsity"].get<double>() == 0.0)) {
      reader.fail("training.vsa.sparsity",
                  "loom has no video sparse attention: give 0.0 (FastVideo's default, dense attention)");
    }
    training.erase("vsa");
  }
  if (training.contains("dit_precision")) {
    if (training["dit_precision"] != "fp32") {
      reader.fail("training.dit_precision", fmt::format("is {}; loom keeps FastVideo's default only: give fp32, and "
                                                        "the plan's mixed_precision stage for lower-precision compute",
                                                        shown(training["dit_precision"])));
    }
    reader.note(
        "training.dit_precision (fp32) is not read: the trained weights are fp32 unless the plan's "
        "default_dtype or mixed_precision stage says otherwise");
    training.erase("dit_precision");
  }
}

}  // namespace

void translate_fastvideo(json& root, fastvideo_reader& reader) {
  if (!root.is_object()) return;  // check_top_level says what a run file is
  std::optional<json> lora;
  distributed_stages distributed;
  fastvideo_role role;
  std::optional<added_stage> seeded, model_recompute, model_path;
  json flow_matching = json::object();
  if (root.contains("method")) {
    const json& method = root["method"];
    if (!method.is_object())
      reader.fail("method", "give {_target_: fastvideo.train.methods.fine_tuning.finetune.FineTuneMethod}");
    reader.require_keys("method", {"_target_"}, method, "method");
    check_target(method, "method", "FineTuneMethod",
                 "loom fine-tunes one model by flow matching, FastVideo's FineTuneMethod; distillation and the other "
                 "methods are not in loom",
                 reader);
    root.erase("method");
  }
  if (root.contains("training")) {
    if (root.contains("train"))
      reader.fail("training", "the file has train too: give the loop's options in one of them");
    json training = root["training"];
    root.erase("training");
    if (training.is_object() && training.contains("distributed")) {
      distributed = fastvideo_distributed(training["distributed"], reader);
      training.erase("distributed");
    }
    if (training.is_object() && training.contains("model")) {
      json model = training["model"];
      if (!model.is_object()) reader.fail("training.model", "give {weighting_scheme: logit_normal, logit_std: 1.0}");
      reader.require_keys("training.model",
                          {"weighting_scheme", "logit_mean", "logit_std", "mode_scale", "precondition_outputs",
                           "moba_config", "enable_gradient_checkpointing_type"},
                          model, "training.model");
      if (model.contains("moba_config")) {
        if (!(model["moba_config"].is_null() || (model["moba_config"].is_object() && model["moba_config"].empty())))
          reader.fail("training.model.moba_config", "loom has no mixture-of-block attention: give {} or leave it out");
        model.erase("moba_config");
      }
      if (model.contains("enable_gradient_checkpointing_type")) {
        model_recompute = recompute_of(model["enable_gradient_checkpointing_type"],
                                       "training.model.enable_gradient_checkpointing_type", reader);
        model.erase("enable_gradient_checkpointing_type");
      }
      flow_matching = model;
      reader.move_lines("training.model", "flow_matching");
      training.erase("model");
    }
    if (training.is_object()) {
      if (training.contains("data")) {
        seeded = fastvideo_data(training["data"], root, flow_matching, reader);
        training.erase("data");
      }
      // The loop's keys before the optimizer's, whose schedule decays over max_train_steps.
      const json loop = training.contains("loop") ? training["loop"] : json();
      if (training.contains("loop")) {
        if (!loop.is_object())
          reader.fail("training.loop", "give {max_train_steps: 4000, gradient_accumulation_steps: 1}");
        reader.require_keys("training.loop", {"max_train_steps", "gradient_accumulation_steps"}, loop, "training.loop");
        if (loop.contains("max_train_steps"))
          map_key(root, "train.steps", loop["max_train_steps"], "training.loop.max_train_steps", reader);
        if (loop.contains("gradient_accumulation_steps")) {
          map_key(root, "train.accumulate", loop["gradient_accumulation_steps"],
                  "training.loop.gradient_accumulation_steps", reader);
        }
        training.erase("loop");
      }
      if (training.contains("optimizer")) {
        fastvideo_optimizer(training["optimizer"], loop, root, reader);
        training.erase("optimizer");
      }
      if (training.contains("checkpoint")) {
        fastvideo_checkpoint(training["checkpoint"], root, reader);
        training.erase("checkpoint");
      }
      if (training.contains("model_path")) {
        // FastVideo's default is the student's init_from; loom's checkpoint is one folder.
        const json& path = training["model_path"];
        if (!path.is_string() || path.get<std::string>().empty())
          reader.fail("training.model_path", "give the checkpoint's folder as a string");
        reader.move_lines("training.model_path", "pretrained");
        model_path = added_stage{json{{"pretrained", path}}, {}};
        training.erase("model_path");
      }
      fastvideo_training_rest(training, reader);
    }
    // The rest of training is train's, in loom's spelling (training.steps), beside the keys mapped above.
    // Key by key: the keys mapped above keep the spelling they were written in.
    if (!training.is_object()) {
      reader.move_lines("training", "train");
      root["train"] = std::move(training);  // train's own check names it
    } else {
      for (const auto& item : training.items()) reader.move_lines("training." + item.key(), "train." + item.key());
    }
    if (training.is_object()) {
      for (auto& item : training.items()) {
        json& train = root["train"];
        if (train.contains(item.key()))
          reader.fail("train." + item.key(), "FastVideo's spelling of it is in the file too: give it once");
        train[item.key()] = std::move(item.value());
      }
    }
  }
  // After training.model: the role's flow_shift is the newer spelling of flow_matching.flow_shift.
  if (root.contains("models")) {
    lora = fastvideo_models(root["models"], flow_matching, role, reader);
    root.erase("models");
  }
  if (model_path) {
    if (role.pretrained && role.pretrained->stage["pretrained"] != model_path->stage["pretrained"]) {
      reader.fail("training.model_path",
                  fmt::format("is {}, but init_from is {}: give one checkpoint", model_path->stage["pretrained"].dump(),
                              role.pretrained->stage["pretrained"].dump()));
    }
    if (!role.pretrained) {
      model_path->later = {"quantized", "quantization_config", "mixed_precision",
                           "recompute", "sequence_parallel",   "tensor_parallel",
                           "lora",      "trainable",           "strategy"};
      role.pretrained = std::move(model_path);
    }
  }
  // The role's gradient checkpointing before training.model's, as FastVideo falls back to the latter.
  if (!role.recompute) role.recompute = std::move(model_recompute);
  if (root.contains("callbacks")) {
    fastvideo_callbacks(root["callbacks"], root, reader);
    root.erase("callbacks");
  }
  if (root.contains("pipeline")) {
    const json& pipeline = root["pipeline"];
    if (!pipeline.is_object())
      reader.fail("pipeline", "give the validation pipeline's options inline: {flow_shift: 3}");
    reader.require_keys("pipeline", {"flow_shift"}, pipeline, "pipeline");
    if (pipeline.contains("flow_shift")) {
      // The validation pipeline's shift: loom's sampler's, which samples only at validation.
      if (root.contains("sampling") && root["sampling"].is_object() && !root["sampling"].contains("shift")) {
        root["sampling"]["shift"] = pipeline["flow_shift"];
        reader.move_lines("pipeline.flow_shift", "sampling.shift");
      } else if (!root.contains("sampling")) {
        reader.note(
            "pipeline.flow_shift is not read: it is the validation sampler's, and the file has no "
            "callbacks.validation");
      } else {
        reader.fail("pipeline.flow_shift", "sets sampling.shift, which the file gives too: give it once");
      }
    }
    root.erase("pipeline");
  }
  if (!flow_matching.empty()) {
    if (root.contains("flow_matching"))
      reader.fail("flow_matching", "the file has FastVideo's training.model or flow_shift too: give them in one place");
    root["flow_matching"] = std::move(flow_matching);
  }
  json& plan = root["plan"];
  if (plan.is_null()) plan = json::array();
  reader.check_plan(plan);
  // Each before the stages the order rules put after it, as a user writing the plan would.
  const auto insert_before = [&plan](json stage, const std::vector<std::string>& later) {
    const auto first_later = std::find_if(plan.begin(), plan.end(), [&later](const json& entry) {
      return entry.is_object() && std::any_of(later.begin(), later.end(),
                                              [&entry](const std::string& name) { return entry.contains(name); });
    });
    plan.insert(first_later, std::move(stage));
  };
  // A stage the plan has already is given twice: one would be lost.
  const auto add = [&](std::optional<added_stage>& added) {
    if (!added) return;
    const std::string name = added->stage.begin().key();
    if (std::any_of(plan.begin(), plan.end(),
                    [&](const json& entry) { return entry.is_object() && entry.contains(name); }))
      reader.fail(name, fmt::format("sets the plan's {} stage, which the plan has too: give it once", name));
    insert_before(std::move(added->stage), added->later);
  };
  add(seeded);
  add(role.pretrained);
  add(role.recompute);
  if (distributed.sequence_parallel)
    insert_before(std::move(*distributed.sequence_parallel), {"lora", "trainable", "strategy"});
  if (distributed.tensor_parallel)
    insert_before(std::move(*distributed.tensor_parallel), {"lora", "trainable", "strategy"});
  if (lora) insert_before(std::move(*lora), {"trainable", "strategy"});
  if (distributed.strategy) plan.push_back(std::move(*distributed.strategy));
  if (plan.empty()) root.erase("plan");
}

}  // namespace loom::config_detail

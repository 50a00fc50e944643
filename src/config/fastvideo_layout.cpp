#include "fastvideo_layout.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <utility>

namespace loom::config_detail {
namespace {

using json = nlohmann::ordered_json;

// The lora stage of `models`' one LoRA block that is enabled, if any; a role's flow_shift goes to
// `flow_matching`.
std::optional<json> fastvideo_models(const json& models, json& flow_matching, fastvideo_reader& reader) {
  if (!models.is_object())
    reader.fail("models", "give each model's role as a key, e.g. models: {transformer: {lora: ...}}");
  std::optional<json> stage;
  std::string enabled_role, shifted_role;
  for (const auto& [role, model] : models.items()) {
    const std::string where = "models." + role;
    if (!model.is_object())
      reader.fail(where, "give the role's settings as an object, e.g. {lora: {enable: true, rank: 8}}");
    reader.require_keys(where, {"lora", "flow_shift"}, model, where);
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
  reader.require_keys(at, {"strategy", "num_gpus", "hsdp_replicate_dim", "hsdp_shard_dim", "sp_size", "tp_size"},
                      distributed, at);
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

}  // namespace

void translate_fastvideo(json& root, fastvideo_reader& reader) {
  if (!root.is_object()) return;  // check_top_level says what a run file is
  std::optional<json> lora;
  distributed_stages distributed;
  json flow_matching = json::object();
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
      const json& model = training["model"];
      if (!model.is_object()) reader.fail("training.model", "give {weighting_scheme: logit_normal, logit_std: 1.0}");
      reader.require_keys("training.model", {"weighting_scheme", "logit_mean", "logit_std", "mode_scale"}, model,
                          "training.model");
      flow_matching = model;
      reader.move_lines("training.model", "flow_matching");
      training.erase("model");
    }
    reader.move_lines("training", "train");
    if (!training.is_object() || !training.empty()) root["train"] = std::move(training);
  }
  // After training.model: the role's flow_shift is the newer spelling of flow_matching.flow_shift.
  if (root.contains("models")) {
    lora = fastvideo_models(root["models"], flow_matching, reader);
    root.erase("models");
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
  const auto insert_before = [&plan](json stage, std::initializer_list<const char*> later) {
    const auto first_later = std::find_if(plan.begin(), plan.end(), [&later](const json& entry) {
      return entry.is_object() &&
             std::any_of(later.begin(), later.end(), [&entry](const char* name) { return entry.contains(name); });
    });
    plan.insert(first_later, std::move(stage));
  };
  if (distributed.sequence_parallel)
    insert_before(std::move(*distributed.sequence_parallel), {"lora", "trainable", "strategy"});
  if (distributed.tensor_parallel)
    insert_before(std::move(*distributed.tensor_parallel), {"lora", "trainable", "strategy"});
  if (lora) insert_before(std::move(*lora), {"trainable", "strategy"});
  if (distributed.strategy) plan.push_back(std::move(*distributed.strategy));
  if (plan.empty()) root.erase("plan");
}

}  // namespace loom::config_detail

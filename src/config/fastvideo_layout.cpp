#include "fastvideo_layout.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

namespace loom::config_detail {
namespace {

using json = nlohmann::ordered_json;

// The lora stage of `models`' one LoRA block that is enabled, if any.
std::optional<json> fastvideo_lora(const json& models, fastvideo_reader& reader) {
  if (!models.is_object())
    reader.fail("models", "give each model's role as a key, e.g. models: {transformer: {lora: ...}}");
  std::optional<json> stage;
  std::string enabled_role;
  for (const auto& [role, model] : models.items()) {
    const std::string where = "models." + role;
    if (!model.is_object())
      reader.fail(where, "give the role's settings as an object, e.g. {lora: {enable: true, rank: 8}}");
    reader.require_keys(where, {"lora"}, model, where);
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

}  // namespace

void translate_fastvideo(json& root, fastvideo_reader& reader) {
  if (!root.is_object()) return;  // check_top_level says what a run file is
  std::optional<json> lora;
  std::optional<json> strategy;
  if (root.contains("models")) {
    lora = fastvideo_lora(root["models"], reader);
    root.erase("models");
  }
  if (root.contains("training")) {
    if (root.contains("train"))
      reader.fail("training", "the file has train too: give the loop's options in one of them");
    json training = root["training"];
    root.erase("training");
    if (training.is_object() && training.contains("distributed")) {
      const json& distributed = training["distributed"];
      if (!distributed.is_object()) reader.fail("training.distributed", "give {strategy: fsdp}");
      reader.require_keys("training.distributed", {"strategy"}, distributed, "training.distributed");
      if (distributed.contains("strategy")) {
        reader.move_lines("training.distributed.strategy", "strategy");
        strategy = json{{"strategy", distributed["strategy"]}};
      }
      training.erase("distributed");
    }
    reader.move_lines("training", "train");
    if (!training.is_object() || !training.empty()) root["train"] = std::move(training);
  }
  json& plan = root["plan"];
  if (plan.is_null()) plan = json::array();
  reader.check_plan(plan);
  if (lora) {  // before the stages the order rules put after lora, as a user writing the plan would
    const auto after_lora = std::find_if(plan.begin(), plan.end(), [](const json& entry) {
      return entry.is_object() && (entry.contains("trainable") || entry.contains("strategy"));
    });
    plan.insert(after_lora, std::move(*lora));
  }
  if (strategy) plan.push_back(std::move(*strategy));
  if (plan.empty()) root.erase("plan");
}

}  // namespace loom::config_detail

#include <loom/job/build_steps.hpp>
#include <loom/lora/adapter.hpp>
#include <loom/lora/lora.hpp>
#include <loom/nn/recompute.hpp>
#include <loom/replicas/replicas.hpp>

namespace loom::build_steps {

std::optional<std::uint64_t> seed(const stage_list& stages) {
  if (const auto stage = stages.find<seeded_stage>()) return stage->seed();
  return std::nullopt;
}

dtypes decide_dtypes(const stage_list& stages) {
  dtypes decided;
  if (const auto stage = stages.find<default_dtype_stage>()) decided.built_in = stage->type();
  if (const auto stage = stages.find<mixed_precision_stage>())
    decided.policy = precision_policy::from(stage->settings());
  return decided;
}

std::shared_ptr<pretrained_checkpoint> open_checkpoint(const stage_list& stages) {
  if (const auto stage = stages.find<pretrained_stage>()) return std::make_shared<pretrained_checkpoint>(stage->path());
  return nullptr;
}

deferral judge_deferred(nn::deferred_init& deferred, const torch::nn::Module& model, bool seeded, std::string& why) {
  if (std::optional<std::string> reason = deferred.accept(model)) {
    why = std::move(*reason);
    if (!seeded) deferred.rewind_generator();
    return deferral::construct_whole;
  }
  return deferred.size() == 0 ? deferral::nothing_deferred : deferral::stands;
}

bool load_pretrained(pretrained_checkpoint& checkpoint, torch::nn::Module& model, bool engine_shards) {
  checkpoint.check(model, &lora_adapter::is_adapter_parameter);
  if (engine_shards) return false;
  checkpoint.copy_into(model, &lora_adapter::is_adapter_parameter);
  return true;
}

std::size_t set_what_trains(torch::nn::Module& model, std::string_view model_name, bool has_lora,
                            const stage_list& stages, std::optional<dtype> built_in) {
  const auto trainable = stages.find<trainable_stage>();
  set_trainable(model, model_name, has_lora, trainable ? trainable->patterns() : target_list{});
  return built_in ? hold_trainable_in_fp32(model) : 0;
}

std::vector<std::string> choose_recomputed_units(torch::nn::Module& model, const stage_list& stages) {
  if (const auto stage = stages.find<recompute_stage>()) return nn::recompute_units(model, stage->settings());
  return {};
}

void move_to_device(torch::nn::Module& model, const runtime& rt, nn::deferred_init* deferred) {
  if (deferred != nullptr) {
    nn::to_device(model, rt.device());
  } else {
    model.to(rt.device());
  }
}

void check_or_broadcast_replicas(const runtime& rt, torch::nn::Module& model, std::optional<std::uint64_t> seed,
                                 nn::deferred_init* deferred) {
  if (seed) {
    verify_identical_replicas(rt, model, *seed);
  } else {
    broadcast_replicas(rt, model, deferred);
  }
  if (deferred != nullptr) deferred->set_advances_generator(!seed);
}

}  // namespace loom::build_steps

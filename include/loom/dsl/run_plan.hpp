// run_plan: a plan whose stages after the model are chosen at run time (a run file's, loom/config),
// held as values. The model stays a C++ type; the strategy is one of the built-in three, so that
// build() can return one job type per strategy (a std::variant) with the typed module in each.
// The order rules are the compile-time ones, run by check_stages, with the same sentences;
// describe() prints what the equivalent typed plan prints.
#pragma once

#include <loom/dsl/default_dtype.hpp>
#include <loom/dsl/lora.hpp>
#include <loom/dsl/mixed_precision.hpp>
#include <loom/dsl/plan.hpp>
#include <loom/dsl/pretrained.hpp>
#include <loom/dsl/recompute.hpp>
#include <loom/dsl/rules.hpp>
#include <loom/dsl/seeded.hpp>
#include <loom/dsl/stage_kind.hpp>
#include <loom/dsl/strategies.hpp>
#include <loom/dsl/trainable.hpp>

#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace loom {

// The strategies a run file can name: a new built-in strategy's stage is added here, and the run-file
// reader (its name, its options' fields) and build()'s run_job follow from the list.
using run_strategy = std::variant<local_stage, ddp_stage, fsdp_stage>;

// The stages after the model, in the order they were given; each kind at most once (a second is
// kept in `kinds` only, for the rules to name).
struct run_stages {
  std::vector<stage_kind> kinds;
  std::optional<seeded_stage> seeded;
  std::optional<default_dtype_stage> default_dtype;
  std::optional<pretrained_stage> pretrained;
  std::optional<mixed_precision_stage> mixed_precision;
  std::optional<recompute_stage> recompute;
  std::optional<lora_stage> lora;
  std::optional<trainable_stage> trainable;
  std::optional<run_strategy> strategy;  // none: local()
};

template <class Model>
class run_plan {
 public:
  using model_type = typename Model::model_type;

  // Throws plan_error with the rule's sentence when the stages break an order rule.
  run_plan(const plan<Model>& model, run_stages stages)
      : model_(std::get<0>(model.stages())), stages_(std::move(stages)) {
    std::vector<stage_kind> kinds{stage_kind::model};
    kinds.insert(kinds.end(), stages_.kinds.begin(), stages_.kinds.end());
    check_stages(kinds);
  }

  [[nodiscard]] const auto& model_args() const noexcept { return model_.args; }
  [[nodiscard]] std::optional<std::uint64_t> seed() const {
    return stages_.seeded ? std::optional(stages_.seeded->seed()) : std::nullopt;
  }
  [[nodiscard]] std::optional<dtype> default_dtype() const {
    return stages_.default_dtype ? std::optional(stages_.default_dtype->type()) : std::nullopt;
  }
  [[nodiscard]] std::optional<mixed_precision_options> mixed_precision() const {
    return stages_.mixed_precision ? std::optional(stages_.mixed_precision->settings()) : std::nullopt;
  }
  [[nodiscard]] std::optional<std::string> pretrained() const {
    return stages_.pretrained ? std::optional(stages_.pretrained->path()) : std::nullopt;
  }
  [[nodiscard]] std::optional<recompute_options> recompute() const {
    return stages_.recompute ? std::optional(stages_.recompute->settings()) : std::nullopt;
  }
  [[nodiscard]] const std::optional<lora_stage>& lora() const noexcept { return stages_.lora; }
  [[nodiscard]] target_list trainable_patterns() const {
    return stages_.trainable ? stages_.trainable->patterns() : target_list{};
  }
  [[nodiscard]] run_strategy strategy() const { return stages_.strategy.value_or(run_strategy(local())); }

  // As the typed plan's: one stage a line, in the given order, then local() when no strategy is named.
  [[nodiscard]] std::string describe() const { return text(/*state_only=*/false); }
  // As the typed plan's describe_state(): without the strategy's layout options.
  [[nodiscard]] std::string describe_state() const { return text(/*state_only=*/true); }

 private:
  [[nodiscard]] std::string text(bool state_only) const {
    std::string text = model_.describe() + '\n';
    for (const stage_kind kind : stages_.kinds) text += describe_stage(kind, state_only) + '\n';
    if (!stages_.strategy) text += local().describe() + '\n';
    return text;
  }

  [[nodiscard]] std::string describe_stage(stage_kind kind, bool state_only) const {
    switch (kind) {
      case stage_kind::seeded: return stages_.seeded->describe();
      case stage_kind::default_dtype: return stages_.default_dtype->describe();
      case stage_kind::mixed_precision: return stages_.mixed_precision->describe();
      case stage_kind::recompute: return stages_.recompute->describe();
      case stage_kind::pretrained: return stages_.pretrained->describe();
      case stage_kind::lora: return stages_.lora->describe();
      case stage_kind::trainable: return stages_.trainable->describe();
      default:
        return std::visit(
            [state_only](const auto& stage) { return state_only ? detail::describe_state(stage) : stage.describe(); },
            *stages_.strategy);
    }
  }

  Model model_;
  run_stages stages_;
};

}  // namespace loom

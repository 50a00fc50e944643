// run_plan: a plan whose stages after the model are chosen at run time (a run file's, loom/config),
// held as values. The model stays a C++ type; the strategy is one of the built-in three, so that
// build() can return one job type per strategy (a std::variant) with the typed module in each.
// The order rules are the compile-time ones, run by check_stages, with the same sentences;
// describe() prints what the equivalent typed plan prints.
#pragma once

#include <loom/dsl/deprecated_accessors.hpp>
#include <loom/dsl/diagnostics.hpp>
#include <loom/dsl/plan.hpp>
#include <loom/dsl/rules.hpp>
#include <loom/dsl/stage_kind.hpp>
#include <loom/dsl/stage_list.hpp>
#include <loom/dsl/strategies.hpp>
#include <loom/dsl/tensor_parallel.hpp>

#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace loom {

// The strategies a run file can name: a new built-in strategy's stage is added here, and the run-file
// reader (its name, its options' fields) and build()'s run_job follow from the list.
using run_strategy = std::variant<local_stage, ddp_stage, fsdp_stage>;

// The stages after the model, as a run file gives them: their kinds as written (a second of a kind
// included, for the rules to name), the stages between the model and the strategy, and the strategy.
struct run_stages {
  std::vector<stage_kind> kinds;
  stage_list stages;
  std::optional<run_strategy> strategy;  // none: local()
};

template <class Model>
class run_plan : public detail::deprecated_stage_accessors<run_plan<Model>> {
 public:
  using model_type = typename Model::model_type;

  // Throws plan_error with the rule's sentence when the stages break an order rule, or the rule on
  // stages' values together that a typed plan checks when it is made (R22).
  run_plan(const plan<Model>& model, run_stages given)
      : model_(std::get<0>(model.stages())), stages_(std::move(given.stages)), strategy_(std::move(given.strategy)) {
    std::vector<stage_kind> kinds{stage_kind::model};
    kinds.insert(kinds.end(), given.kinds.begin(), given.kinds.end());
    check_stages(kinds);
    detail::enforce(tensor_parallel_violation(stages_));
  }

  [[nodiscard]] const auto& model_args() const noexcept { return model_.args; }
  // As the typed plan's: the stage of type S, if the plan has one.
  template <PlanStage S>
  [[nodiscard]] std::optional<S> find() const {
    return stages_.template find<S>();
  }
  [[nodiscard]] const stage_list& stage_values() const noexcept { return stages_; }
  [[nodiscard]] run_strategy strategy() const { return strategy_.value_or(run_strategy(local())); }

  // As the typed plan's: one stage a line, in the given order, then local() when no strategy is named.
  [[nodiscard]] std::string describe() const { return text(/*state_only=*/false); }
  // As the typed plan's describe_state(): without the strategy's layout options.
  [[nodiscard]] std::string describe_state() const { return text(/*state_only=*/true); }

 private:
  [[nodiscard]] std::string text(bool state_only) const {
    return model_.describe() + '\n' + stages_.describe(state_only) +
           std::visit([state_only](
                          const auto& stage) { return state_only ? detail::describe_state(stage) : stage.describe(); },
                      strategy()) +
           '\n';
  }

  Model model_;
  stage_list stages_;
  std::optional<run_strategy> strategy_;
};

}  // namespace loom

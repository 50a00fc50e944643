// stage_list: the stages between the model and the strategy as one value, in the order given, each
// kind at most once. What build() and describe() read of a plan, whether it was typed (plan<...>) or
// read from a run file (run_plan): a stage is read through the one query find<S>(), never through an
// accessor of its own.
#pragma once

#include <loom/dsl/default_dtype.hpp>
#include <loom/dsl/lora.hpp>
#include <loom/dsl/mixed_precision.hpp>
#include <loom/dsl/pipe.hpp>
#include <loom/dsl/pretrained.hpp>
#include <loom/dsl/quantized.hpp>
#include <loom/dsl/recompute.hpp>
#include <loom/dsl/seeded.hpp>
#include <loom/dsl/sequence_parallel.hpp>
#include <loom/dsl/tensor_parallel.hpp>
#include <loom/dsl/trainable.hpp>

#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace loom {

// Every stage that may stand between the model and the strategy. A new such stage joins this list:
// the typed plan, the run file's plan, find<S>() and describe() follow from it.
using plan_stage =
    std::variant<seeded_stage, default_dtype_stage, pretrained_stage, quantized_stage, mixed_precision_stage,
                 recompute_stage, sequence_parallel_stage, tensor_parallel_stage, lora_stage, trainable_stage>;

namespace detail {

template <class S, class Variant>
inline constexpr bool is_alternative = false;
template <class S, class... Alternatives>
inline constexpr bool is_alternative<S, std::variant<Alternatives...>> = (std::is_same_v<S, Alternatives> || ...);

}  // namespace detail

template <class S>
concept PlanStage = detail::is_alternative<S, plan_stage>;

class stage_list {
 public:
  stage_list() = default;

  // The plan stages of a typed plan's tuple, in its order (the model and the strategy are not).
  template <class... Stages>
  static stage_list of(const std::tuple<Stages...>& stages) {
    stage_list list;
    std::apply(
        [&list](const auto&... each) {
          (
              [&list](const auto& stage) {
                if constexpr (PlanStage<std::remove_cvref_t<decltype(stage)>>) list.add(stage);
              }(each),
              ...);
        },
        stages);
    return list;
  }

  // Appended in order. A kind that is already there is not added again: the order rules, which see
  // every stage as written, name the second.
  void add(plan_stage stage) {
    const auto same_kind = [&stage](const plan_stage& held) { return held.index() == stage.index(); };
    for (const plan_stage& held : stages_)
      if (same_kind(held)) return;
    stages_.push_back(std::move(stage));
  }

  // The stage of type S, if the plan has one.
  template <PlanStage S>
  [[nodiscard]] std::optional<S> find() const {
    for (const plan_stage& held : stages_)
      if (const S* stage = std::get_if<S>(&held)) return *stage;
    return std::nullopt;
  }

  // One stage a line, each ending in '\n'; with `state_only`, as a checkpoint records them.
  [[nodiscard]] std::string describe(bool state_only = false) const {
    std::string text;
    for (const plan_stage& held : stages_)
      text +=
          std::visit(
              [state_only](const auto& stage) { return state_only ? detail::describe_state(stage) : stage.describe(); },
              held) +
          '\n';
    return text;
  }

 private:
  std::vector<plan_stage> stages_;
};

}  // namespace loom

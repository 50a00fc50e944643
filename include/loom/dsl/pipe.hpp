// operator|: stages compose into a partial pipeline (closure), and anything piped into a model is a
// plan. Every composition runs the order rules, and one that makes a plan the rule on several stages'
// values (R22); a broken one fails right at the |.
#pragma once

#include <loom/dsl/diagnostics.hpp>
#include <loom/dsl/rule_table.hpp>
#include <loom/dsl/rules.hpp>
#include <loom/dsl/stage_kind.hpp>
#include <loom/dsl/violation.hpp>

#include <array>
#include <concepts>
#include <string>
#include <tuple>
#include <utility>

namespace loom {

template <class Model, class... Stages>
class plan;

template <class... Stages>
class closure;

namespace detail {

struct pipeable;

// A stage, a closure or a plan: anything that can stand on either side of |.
template <class T>
concept pipeline_part = std::derived_from<T, pipeable>;

template <class T>
concept stage = pipeline_part<T> && requires {
  { T::kind } -> std::convertible_to<stage_kind>;
};

template <stage S>
constexpr std::tuple<S> stages_of(const S& s) {
  return std::tuple<S>(s);
}

template <pipeline_part P>
requires(!stage<P>) constexpr const auto& stages_of(const P& p) { return p.stages(); }

template <class... Stages>
inline constexpr std::array<stage_kind, sizeof...(Stages)> kinds_of{Stages::kind...};

template <class Tuple>
inline constexpr violation violation_in = violation::none;

template <class First, class... Rest>
inline constexpr violation violation_in<std::tuple<First, Rest...>> =
    First::kind == stage_kind::model ? first_violation(kinds_of<First, Rest...>)
                                     : first_violation_in_fragment(kinds_of<First, Rest...>);

// The stages of `Lhs | Rhs`, in order.
template <class Lhs, class Rhs>
using joined_stages =
    decltype(std::tuple_cat(stages_of(std::declval<const Lhs&>()), stages_of(std::declval<const Rhs&>())));

// Whether stages, in order, are a whole plan: the model first.
template <class Tuple>
inline constexpr bool is_whole_plan = std::tuple_element_t<0, Tuple>::kind == stage_kind::model;

template <class First, class... Rest>
constexpr auto make_pipeline(std::tuple<First, Rest...>&& stages) {
  if constexpr (First::kind == stage_kind::model) {
    return plan<First, Rest...>(std::move(stages));
  } else {
    return closure<First, Rest...>(std::move(stages));
  }
}

// A stage as a checkpoint records it: describe() without its layout options (option_role), for a
// stage that has such options.
template <class Stage>
std::string describe_state(const Stage& stage) {
  if constexpr (requires { stage.describe_state(); }) {
    return stage.describe_state();
  } else {
    return stage.describe();
  }
}

// Prints stages one a line, each line ending in '\n'; with `state_only`, as describe_state does.
template <class... Stages>
std::string describe_stages(const std::tuple<Stages...>& stages, bool state_only = false) {
  std::string text;
  std::apply(
      [&](const auto&... each) { ((text += (state_only ? describe_state(each) : each.describe()) + '\n'), ...); },
      stages);
  return text;
}

template <class>
inline constexpr bool dependent_false = false;

// The base of every stage, closure and plan; it brings operator| into scope by argument-dependent
// lookup only (hidden friends), so loom's | never competes with anyone else's.
struct pipeable {
  template <pipeline_part Lhs, pipeline_part Rhs>
  friend constexpr auto operator|(const Lhs& lhs, const Rhs& rhs) {
    joined_stages<Lhs, Rhs> stages = std::tuple_cat(stages_of(lhs), stages_of(rhs));
    // A broken order rule stops the build here, at the |, with its sentence.
    LOOM_STATIC_CHECK(violation_in<joined_stages<Lhs, Rhs>>);
    auto pipeline = make_pipeline(std::move(stages));
    // A rule on the values of several stages (R22) needs the values: a constant plan that breaks it
    // stops the build here too, and one made at run time throws plan_error.
    if constexpr (is_whole_plan<joined_stages<Lhs, Rhs>>) enforce(pipeline.values_violation());
    return pipeline;
  }

  // The commonest slip, `| loom::ddp` for `| loom::ddp()`: one sentence instead of a candidate list.
  template <pipeline_part Lhs, class Rhs>
  requires(!pipeline_part<Rhs>) friend constexpr Lhs operator|(const Lhs& lhs, const Rhs&) {
    LOOM_STATIC_CHECK(dependent_false<Rhs> ? violation::none : violation::r13_not_a_stage);
    return lhs;
  }
};

}  // namespace detail

// Whether `lhs | rhs` compiles: both sides are stages, closures or plans, and together they break no
// rule. (operator| itself accepts any two and static_asserts, to print the rule's sentence.)
template <class Lhs, class Rhs>
concept composable =
    detail::pipeline_part<Lhs> && detail::pipeline_part<Rhs> && detail::violation_in<detail::joined_stages<Lhs, Rhs>>
== violation::none;

// A partial pipeline, such as `lora(8) | ddp()`: a value to pipe into a model later.
template <class... Stages>
class closure : public detail::pipeable {
 public:
  constexpr explicit closure(std::tuple<Stages...> stages) : stages_(std::move(stages)) {}

  [[nodiscard]] constexpr const std::tuple<Stages...>& stages() const noexcept { return stages_; }
  [[nodiscard]] std::string describe() const { return detail::describe_stages(stages_); }

 private:
  std::tuple<Stages...> stages_;
};

}  // namespace loom

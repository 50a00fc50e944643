// plan<model_stage<M, Args...>, Stages...>: a whole pipeline, model first. A value: copyable, and
// constexpr when its arguments are. What the runtime reads of it is below.
#pragma once

#include <loom/dsl/deprecated_accessors.hpp>
#include <loom/dsl/pipe.hpp>
#include <loom/dsl/rule_table.hpp>
#include <loom/dsl/stage_kind.hpp>
#include <loom/dsl/stage_list.hpp>
#include <loom/dsl/strategies.hpp>
#include <loom/dsl/tensor_parallel.hpp>
#include <loom/dsl/violation.hpp>

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace loom {
namespace detail {

template <std::size_t N>
constexpr std::size_t index_of(const std::array<stage_kind, N>& kinds, bool (*matches)(stage_kind)) noexcept {
  for (std::size_t i = 0; i != N; ++i)
    if (matches(kinds[i])) return i;
  return N;
}

template <std::size_t Index, class Tuple, bool Found = (Index < std::tuple_size_v<Tuple>)>
struct strategy_at {
  using type = std::tuple_element_t<Index, Tuple>;
};

template <std::size_t Index, class Tuple>
struct strategy_at<Index, Tuple, false> {
  using type = local_stage;  // no strategy stage: the plan runs locally
};

}  // namespace detail

template <class Model, class... Stages>
class plan : public detail::pipeable, public detail::deprecated_stage_accessors<plan<Model, Stages...>> {
  using stage_tuple = std::tuple<Model, Stages...>;

  template <stage_kind K>
  static constexpr bool is(stage_kind k) noexcept {
    return k == K;
  }

 public:
  static constexpr std::array<stage_kind, 1 + sizeof...(Stages)> kinds{Model::kind, Stages::kind...};
  static constexpr std::size_t strategy_index = detail::index_of(kinds, is_strategy);

  using model_type = typename Model::model_type;
  // local_stage, ddp_stage, fsdp_stage or strategy_stage<S>.
  using strategy_type = typename detail::strategy_at<strategy_index, stage_tuple>::type;

  constexpr explicit plan(stage_tuple stages) : stages_(std::move(stages)) {}

  [[nodiscard]] constexpr const stage_tuple& stages() const noexcept { return stages_; }

  // The arguments for model_type's constructor, as given to model<M>(args...).
  [[nodiscard]] constexpr const auto& model_args() const noexcept { return std::get<0>(stages_).args; }

  // The stage of type S (seeded_stage, lora_stage, ...), if the plan has one: the one query for every
  // stage between the model and the strategy.
  template <PlanStage S>
  [[nodiscard]] constexpr std::optional<S> find() const {
    if constexpr (constexpr std::size_t i = detail::index_of(kinds, is<S::kind>); i != kinds.size()) {
      return std::get<i>(stages_);
    } else {
      return std::nullopt;
    }
  }

  // The first rule that the stages' values break together (R22: a sequence split with a tensor split),
  // or violation::none. operator| checks it on the plan it makes: while compiling, for a constant plan.
  [[nodiscard]] constexpr violation values_violation() const { return tensor_parallel_violation(*this); }

  // Those stages as the value build() reads, whatever plan they came from.
  [[nodiscard]] stage_list stage_values() const { return stage_list::of(stages_); }

  // The strategy stage; local() when the plan names none.
  [[nodiscard]] constexpr strategy_type strategy() const {
    if constexpr (strategy_index != kinds.size()) {
      return std::get<strategy_index>(stages_);
    } else {
      return local();
    }
  }

  // One stage a line, every option spelled out, the default strategy included; see docs/dsl.md.
  [[nodiscard]] std::string describe() const { return text(/*state_only=*/false); }
  // describe() without the strategy's layout options (option_role): what a checkpoint compares.
  [[nodiscard]] std::string describe_state() const { return text(/*state_only=*/true); }

 private:
  [[nodiscard]] std::string text(bool state_only) const {
    std::string text = detail::describe_stages(stages_, state_only);
    if constexpr (strategy_index == kinds.size()) text += strategy().describe() + '\n';
    return text;
  }

  stage_tuple stages_;
};

template <class T>
inline constexpr bool is_plan = false;

template <class Model, class... Stages>
inline constexpr bool is_plan<plan<Model, Stages...>> = true;

// A whole plan (model first), as opposed to a closure or anything else.
template <class T>
concept Plan = is_plan<std::remove_cvref_t<T>>;

// Whether the plan names its strategy (otherwise it runs with local()).
template <Plan P>
inline constexpr bool has_strategy = std::remove_cvref_t<P>::strategy_index != std::remove_cvref_t<P>::kinds.size();

// R1 for functions that take a plan (loom::build): a closure or another type gets the sentence.
template <class P>
consteval void require_plan() {
  LOOM_STATIC_CHECK(is_plan<std::remove_cvref_t<P>> ? violation::none : violation::r1_no_model);
}

}  // namespace loom

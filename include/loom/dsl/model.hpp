// model<M>(args...): the model source, the head of every plan.
#pragma once

#include <loom/dsl/describe.hpp>
#include <loom/dsl/pipe.hpp>
#include <loom/dsl/plan.hpp>
#include <loom/dsl/rule_table.hpp>
#include <loom/dsl/stage_kind.hpp>
#include <loom/dsl/violation.hpp>

#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace loom {

template <class M, class... Args>
struct model_stage : detail::pipeable {
  using model_type = M;
  static constexpr stage_kind kind = stage_kind::model;

  std::tuple<Args...> args;  // M's constructor arguments, stored by value

  constexpr explicit model_stage(std::tuple<Args...> arguments) : args(std::move(arguments)) {}

  // "model<demo::TinyGpt>(1 arg)": argument values need not be printable.
  [[nodiscard]] std::string describe() const {
    constexpr std::size_t count = sizeof...(Args);
    return "model<" + std::string(detail::type_name<M>()) + ">(" + std::to_string(count) +
           (count == 1 ? " arg)" : " args)");
  }
};

// A plan of one stage; whether M is a LibTorch module constructible from args (R7) is checked where
// the plan meets LibTorch.
template <class M, class... Args>
constexpr plan<model_stage<M, std::decay_t<Args>...>> model(Args&&... args) {
  LOOM_STATIC_CHECK(std::is_class_v<M> ? violation::none : violation::r7_model_not_class);
  return plan<model_stage<M, std::decay_t<Args>...>>(std::tuple(
      model_stage<M, std::decay_t<Args>...>(std::tuple<std::decay_t<Args>...>(std::forward<Args>(args)...))));
}

}  // namespace loom

// The Strategy concept, and strategy(S{...}): a user-written strategy as the last stage of a plan.
#pragma once

#include <loom/dsl/describe.hpp>
#include <loom/dsl/pipe.hpp>
#include <loom/dsl/rule_table.hpp>
#include <loom/dsl/stage_kind.hpp>
#include <loom/dsl/strategies.hpp>

#include <concepts>
#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace loom {

// What a strategy sees of the job: the built module, the process group, the schedule. Defined by the
// runtime; the DSL only names it.
class strategy_context;

// The requirements of Strategy one by one, so that each gets its own diagnostic (R8).
namespace strategy_requirements {

template <class S>
concept has_name = requires {
  { S::name } -> std::convertible_to<std::string_view>;
  typename std::integral_constant<std::size_t, std::string_view(S::name).size()>;  // a constant
};

template <class S>
concept has_options = requires(const S& s) {
  { s.options() } -> std::convertible_to<std::string>;
};

template <class S>
concept has_setup = requires(S& s, strategy_context& context) {
  s.setup(context);
};

template <class S>
concept has_before_forward = requires(S& s, strategy_context& context) {
  s.before_forward(context);
};

template <class S>
concept has_after_backward = requires(S& s, strategy_context& context) {
  s.after_backward(context);
};

}  // namespace strategy_requirements

// A strategy wraps the built module for a process group (setup), and runs around the user's forward
// and backward (before_forward, after_backward). It is copyable because a plan is a value.
template <class S>
concept Strategy = std::copy_constructible<S> && strategy_requirements::has_name<S> &&
    strategy_requirements::has_options<S> && strategy_requirements::has_setup<S> &&
    strategy_requirements::has_before_forward<S> && strategy_requirements::has_after_backward<S>;

template <class S>
class strategy_stage : public detail::pipeable {
 public:
  using strategy_type = S;
  static constexpr stage_kind kind = stage_kind::custom_strategy;

  constexpr explicit strategy_stage(S strategy) : strategy_(std::move(strategy)) {}

  [[nodiscard]] constexpr S& get() noexcept { return strategy_; }
  [[nodiscard]] constexpr const S& get() const noexcept { return strategy_; }

  [[nodiscard]] std::string describe() const { return detail::call_text(S::name, std::string(strategy_.options())); }

 private:
  S strategy_;
};

namespace detail {

enum class strategy_gap : unsigned char { none, name, options, setup, before_forward, after_backward, copy };

// The first requirement of Strategy that S misses, in the order the R8 sentences are listed.
template <class S>
consteval strategy_gap first_gap() {
  namespace req = strategy_requirements;
  if constexpr (!req::has_name<S>)
    return strategy_gap::name;
  else if constexpr (!req::has_options<S>)
    return strategy_gap::options;
  else if constexpr (!req::has_setup<S>)
    return strategy_gap::setup;
  else if constexpr (!req::has_before_forward<S>)
    return strategy_gap::before_forward;
  else if constexpr (!req::has_after_backward<S>)
    return strategy_gap::after_backward;
  else if constexpr (!std::copy_constructible<S>)
    return strategy_gap::copy;
  else
    return strategy_gap::none;
}

}  // namespace detail

// strategy(my_strategy{...}): the first requirement that the type misses is reported, by name.
template <class S>
constexpr auto strategy(S s) {
  constexpr detail::strategy_gap gap = detail::first_gap<S>();
  static_assert(gap != detail::strategy_gap::name, LOOM_R8_NO_NAME);
  static_assert(gap != detail::strategy_gap::options, LOOM_R8_NO_OPTIONS);
  static_assert(gap != detail::strategy_gap::setup, LOOM_R8_NO_SETUP);
  static_assert(gap != detail::strategy_gap::before_forward, LOOM_R8_NO_BEFORE_FORWARD);
  static_assert(gap != detail::strategy_gap::after_backward, LOOM_R8_NO_AFTER_BACKWARD);
  static_assert(gap != detail::strategy_gap::copy, LOOM_R8_NOT_COPYABLE);
  if constexpr (gap == detail::strategy_gap::none) {
    return strategy_stage<S>(std::move(s));
  } else {
    return local_stage{};  // a stand-in after the error above, so that it stays the only one
  }
}

}  // namespace loom

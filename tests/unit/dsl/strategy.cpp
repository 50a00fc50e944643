// The Strategy concept, requirement by requirement, and a user-written strategy in a plan.
#include <loom/dsl.hpp>

#include <catch2/catch_test_macros.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <type_traits>

namespace {

struct every_step {
  static constexpr std::string_view name = "every_step";
  int period = 1;
  std::string options() const { return "period=" + std::to_string(period); }
  void setup(loom::strategy_context&) {}
  void before_forward(loom::strategy_context&) {}
  void after_backward(loom::strategy_context&) {}
};

struct nameless {
  std::string options() const { return {}; }
  void setup(loom::strategy_context&) {}
  void before_forward(loom::strategy_context&) {}
  void after_backward(loom::strategy_context&) {}
};

struct runtime_name {  // a name that is not a constant
  static inline std::string_view name = "runtime";
  std::string options() const { return {}; }
  void setup(loom::strategy_context&) {}
  void before_forward(loom::strategy_context&) {}
  void after_backward(loom::strategy_context&) {}
};

struct no_hooks {
  static constexpr std::string_view name = "no_hooks";
  std::string options() const { return {}; }
};

struct move_only {
  static constexpr std::string_view name = "move_only";
  std::unique_ptr<int> state;
  std::string options() const { return {}; }
  void setup(loom::strategy_context&) {}
  void before_forward(loom::strategy_context&) {}
  void after_backward(loom::strategy_context&) {}
};

}  // namespace

TEST_CASE("Strategy, requirement by requirement", "[dsl][strategy]") {
  namespace req = loom::strategy_requirements;
  STATIC_REQUIRE(loom::Strategy<every_step>);

  STATIC_REQUIRE_FALSE(req::has_name<nameless>);
  STATIC_REQUIRE_FALSE(req::has_name<runtime_name>);
  STATIC_REQUIRE_FALSE(loom::Strategy<nameless>);

  STATIC_REQUIRE(req::has_options<no_hooks>);
  STATIC_REQUIRE_FALSE(req::has_setup<no_hooks>);
  STATIC_REQUIRE_FALSE(req::has_before_forward<no_hooks>);
  STATIC_REQUIRE_FALSE(req::has_after_backward<no_hooks>);
  STATIC_REQUIRE_FALSE(loom::Strategy<no_hooks>);

  STATIC_REQUIRE(req::has_after_backward<move_only>);
  STATIC_REQUIRE_FALSE(loom::Strategy<move_only>);

  // Built-in strategies are mapped to engines by the runtime and need not model the concept.
  STATIC_REQUIRE_FALSE(loom::Strategy<loom::ddp_stage>);
}

TEST_CASE("a user-written strategy in a plan", "[dsl][strategy]") {
  struct Model {};
  const auto plan = loom::model<Model>() | loom::lora(8) | loom::strategy(every_step{.period = 4});
  STATIC_REQUIRE(loom::has_strategy<decltype(plan)>);
  STATIC_REQUIRE(std::is_same_v<decltype(plan)::strategy_type, loom::strategy_stage<every_step>>);
  CHECK(plan.strategy().get().period == 4);
  CHECK(plan.describe().ends_with("every_step(period=4)\n"));
  STATIC_REQUIRE_FALSE(loom::composable<decltype(plan), loom::ddp_stage>);  // R2
}

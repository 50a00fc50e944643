// What the runtime reads of a plan.
#include <loom/dsl.hpp>

#include <catch2/catch_test_macros.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>

namespace {

struct config {
  int width = 0;
  double scale = 1.0;
};

struct TinyGpt {
  explicit TinyGpt(config c) : width(c.width) {}
  int width;
};

}  // namespace

TEST_CASE("a plan is a constexpr value", "[dsl][plan]") {
  constexpr auto plan = loom::model<TinyGpt>(config{.width = 64}) | loom::seeded(42) |
                        loom::lora(16, {"q_proj", "v_proj"}) | loom::trainable({"norm"}) | loom::ddp();

  STATIC_REQUIRE(std::is_same_v<decltype(plan)::model_type, TinyGpt>);
  STATIC_REQUIRE(std::get<0>(plan.model_args()).width == 64);
  STATIC_REQUIRE(plan.find<loom::seeded_stage>()->seed() == 42);
  STATIC_REQUIRE(plan.find<loom::lora_stage>().has_value());
  STATIC_REQUIRE(plan.find<loom::lora_stage>()->rank() == 16);
  STATIC_REQUIRE(plan.find<loom::trainable_stage>()->patterns() == loom::target_list{"norm"});
  STATIC_REQUIRE(loom::has_strategy<decltype(plan)>);
  STATIC_REQUIRE(std::is_same_v<decltype(plan)::strategy_type, loom::ddp_stage>);
  STATIC_REQUIRE(plan.strategy().settings().bucket_cap_mb == 25);

  const auto copy = plan;  // a value: copies carry every stage
  CHECK(copy.describe() == plan.describe());
}

TEST_CASE("what a plan of one model reports", "[dsl][plan]") {
  constexpr auto plan = loom::model<TinyGpt>(config{.width = 8});
  STATIC_REQUIRE(!plan.find<loom::seeded_stage>().has_value());
  STATIC_REQUIRE(!plan.find<loom::lora_stage>().has_value());
  STATIC_REQUIRE(!plan.find<loom::trainable_stage>().has_value());
  STATIC_REQUIRE_FALSE(loom::has_strategy<decltype(plan)>);
  STATIC_REQUIRE(std::is_same_v<decltype(plan)::strategy_type, loom::local_stage>);
  STATIC_REQUIRE(std::is_same_v<decltype(plan.strategy()), loom::local_stage>);
  STATIC_REQUIRE(std::get<0>(plan.model_args()).width == 8);
}

TEST_CASE("model<M>(args...) stores decayed copies of its arguments", "[dsl][plan]") {
  std::string name = "tiny";
  const auto plan = loom::model<TinyGpt>(name, 3, "literal");
  STATIC_REQUIRE(
      std::is_same_v<std::remove_cvref_t<decltype(plan.model_args())>, std::tuple<std::string, int, const char*>>);
  name.clear();
  CHECK(std::get<0>(plan.model_args()) == "tiny");
}

TEST_CASE("strategy options", "[dsl][plan]") {
  constexpr auto ddp = loom::model<TinyGpt>(config{}) |
                       loom::ddp({.bucket_cap_mb = 50, .find_unused_parameters = true, .static_graph = true});
  STATIC_REQUIRE(ddp.strategy().settings().bucket_cap_mb == 50);
  STATIC_REQUIRE(!ddp.strategy().settings().broadcast_buffers);
  STATIC_REQUIRE(ddp.strategy().settings().find_unused_parameters);
  STATIC_REQUIRE(!ddp.strategy().settings().gradient_as_bucket_view);
  STATIC_REQUIRE(ddp.strategy().settings().static_graph);

  constexpr auto fsdp = loom::model<TinyGpt>(config{}) | loom::fsdp();
  STATIC_REQUIRE(fsdp.strategy().settings().reshard_after_forward);
  STATIC_REQUIRE(!loom::fsdp({.reshard_after_forward = false}).settings().reshard_after_forward);
}

// Which stage may follow which: loom::composable mirrors what operator| accepts.
#include <loom/dsl.hpp>

#include <catch2/catch_test_macros.hpp>

#include <type_traits>

namespace {

struct Model {};

using model_only = decltype(loom::model<Model>());
using with_seed = decltype(loom::model<Model>() | loom::seeded(1));
using with_lora = decltype(loom::model<Model>() | loom::lora(8));
using with_ddp = decltype(loom::model<Model>() | loom::ddp());
using seeded_t = loom::seeded_stage;
using lora_t = loom::lora_stage;
using trainable_t = loom::trainable_stage;
using adapters = decltype(loom::lora(8) | loom::ddp());

}  // namespace

TEST_CASE("stages that may follow a model", "[dsl][composition]") {
  STATIC_REQUIRE(loom::composable<model_only, seeded_t>);
  STATIC_REQUIRE(loom::composable<model_only, lora_t>);
  STATIC_REQUIRE(loom::composable<model_only, loom::ddp_stage>);
  STATIC_REQUIRE(loom::composable<model_only, loom::fsdp_stage>);
  STATIC_REQUIRE(loom::composable<model_only, loom::local_stage>);
  STATIC_REQUIRE(loom::composable<model_only, adapters>);
  STATIC_REQUIRE_FALSE(loom::composable<model_only, trainable_t>);  // R9
  STATIC_REQUIRE_FALSE(loom::composable<model_only, model_only>);   // R1
}

TEST_CASE("order rules at the |", "[dsl][composition]") {
  STATIC_REQUIRE(loom::composable<with_seed, lora_t>);
  STATIC_REQUIRE(loom::composable<with_lora, trainable_t>);
  STATIC_REQUIRE_FALSE(loom::composable<with_seed, seeded_t>);         // R4
  STATIC_REQUIRE_FALSE(loom::composable<with_lora, seeded_t>);         // R4
  STATIC_REQUIRE_FALSE(loom::composable<with_lora, lora_t>);           // R6
  STATIC_REQUIRE_FALSE(loom::composable<with_ddp, lora_t>);            // R3
  STATIC_REQUIRE_FALSE(loom::composable<with_ddp, trainable_t>);       // R3
  STATIC_REQUIRE_FALSE(loom::composable<with_ddp, loom::fsdp_stage>);  // R2
  STATIC_REQUIRE_FALSE(loom::composable<with_ddp, seeded_t>);          // R2
  STATIC_REQUIRE_FALSE(loom::composable<with_lora, adapters>);         // R6, through a closure
}

TEST_CASE("stage | stage is a closure, checked as the tail of a plan", "[dsl][composition]") {
  STATIC_REQUIRE(loom::composable<seeded_t, lora_t>);
  STATIC_REQUIRE(loom::composable<trainable_t, loom::ddp_stage>);  // lora may come before, from a plan
  STATIC_REQUIRE(loom::composable<adapters, adapters> == false);   // R6 (and R2)
  STATIC_REQUIRE_FALSE(loom::composable<lora_t, seeded_t>);        // seeded must open the tail
  STATIC_REQUIRE_FALSE(loom::composable<trainable_t, lora_t>);     // R9
  STATIC_REQUIRE_FALSE(loom::composable<loom::local_stage, lora_t>);
  STATIC_REQUIRE_FALSE(loom::composable<lora_t, model_only>);  // R1
  STATIC_REQUIRE_FALSE(loom::composable<model_only, int>);     // not a stage (R13)
}

TEST_CASE("what | produces", "[dsl][composition]") {
  constexpr auto tail = loom::seeded(7) | loom::lora(4) | loom::fsdp();
  STATIC_REQUIRE(std::is_same_v<std::remove_cvref_t<decltype(tail)>,
                                loom::closure<loom::seeded_stage, loom::lora_stage, loom::fsdp_stage>>);
  STATIC_REQUIRE_FALSE(loom::Plan<decltype(tail)>);

  constexpr auto plan = loom::model<Model>() | tail;
  STATIC_REQUIRE(loom::Plan<decltype(plan)>);
  STATIC_REQUIRE(
      std::is_same_v<std::remove_cvref_t<decltype(plan)>,
                     loom::plan<loom::model_stage<Model>, loom::seeded_stage, loom::lora_stage, loom::fsdp_stage>>);
  // Grouping does not matter.
  constexpr auto left = (loom::model<Model>() | loom::seeded(7)) | (loom::lora(4) | loom::fsdp());
  STATIC_REQUIRE(std::is_same_v<decltype(left), decltype(plan)>);
  STATIC_REQUIRE(left.find<loom::seeded_stage>()->seed() == plan.find<loom::seeded_stage>()->seed());
}

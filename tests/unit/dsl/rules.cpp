// The order rules as constexpr functions, and their run-time twin check_stages.
#include <loom/dsl.hpp>

#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <array>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

using enum loom::stage_kind;
using loom::violation;

template <std::size_t N>
constexpr violation first(const loom::stage_kind (&kinds)[N]) {
  return loom::first_violation(std::span<const loom::stage_kind>(kinds, N));
}

}  // namespace

TEST_CASE("valid plans break no rule", "[dsl][rules]") {
  STATIC_REQUIRE(first({model}) == violation::none);
  STATIC_REQUIRE(first({model, seeded, lora, trainable, ddp}) == violation::none);
  STATIC_REQUIRE(first({model, lora, fsdp}) == violation::none);
  STATIC_REQUIRE(first({model, seeded, custom_strategy}) == violation::none);
  STATIC_REQUIRE(first({model, local}) == violation::none);
  STATIC_REQUIRE(first({model, seeded, default_dtype, lora, mixed_precision, fsdp}) == violation::none);
  STATIC_REQUIRE(first({model, default_dtype, mixed_precision, lora, trainable, ddp}) == violation::none);
  STATIC_REQUIRE(first({model, seeded, recompute, lora, mixed_precision, fsdp}) == violation::none);
  STATIC_REQUIRE(first({model, lora, trainable, recompute, ddp}) == violation::none);
}

TEST_CASE("each order rule, as the first violation", "[dsl][rules]") {
  STATIC_REQUIRE(loom::first_violation({}) == violation::r1_no_model);
  STATIC_REQUIRE(first({lora, ddp}) == violation::r1_no_model);
  STATIC_REQUIRE(first({seeded, model}) == violation::r1_model_not_first);
  STATIC_REQUIRE(first({model, lora, model}) == violation::r1_two_models);
  STATIC_REQUIRE(first({model, ddp, fsdp}) == violation::r2_two_strategies);
  STATIC_REQUIRE(first({model, ddp, seeded}) == violation::r2_seeded_after_strategy);
  STATIC_REQUIRE(first({model, ddp, lora}) == violation::r3_lora_after_ddp);
  STATIC_REQUIRE(first({model, fsdp, lora}) == violation::r3_lora_after_fsdp);
  STATIC_REQUIRE(first({model, local, lora}) == violation::r3_lora_after_strategy);
  STATIC_REQUIRE(first({model, custom_strategy, lora}) == violation::r3_lora_after_strategy);
  STATIC_REQUIRE(first({model, lora, ddp, trainable}) == violation::r3_trainable_after_ddp);
  STATIC_REQUIRE(first({model, lora, fsdp, trainable}) == violation::r3_trainable_after_fsdp);
  STATIC_REQUIRE(first({model, lora, local, trainable}) == violation::r3_trainable_after_strategy);
  STATIC_REQUIRE(first({model, seeded, seeded}) == violation::r4_seeded_twice);
  STATIC_REQUIRE(first({model, lora, seeded}) == violation::r4_seeded_not_after_model);
  STATIC_REQUIRE(first({model, lora, lora}) == violation::r6_two_loras);
  STATIC_REQUIRE(first({model, trainable}) == violation::r9_trainable_without_lora);
  STATIC_REQUIRE(first({model, lora, trainable, trainable}) == violation::r10_trainable_twice);
  STATIC_REQUIRE(first({model, mixed_precision, lora, mixed_precision}) == violation::r15_two_mixed_precisions);
  STATIC_REQUIRE(first({model, ddp, mixed_precision}) == violation::r15_mixed_precision_after_strategy);
  STATIC_REQUIRE(first({model, default_dtype, seeded}) == violation::r4_seeded_not_after_model);
  STATIC_REQUIRE(first({model, seeded, default_dtype, default_dtype}) == violation::r17_default_dtype_twice);
  STATIC_REQUIRE(first({model, mixed_precision, default_dtype}) == violation::r17_default_dtype_not_after_model);
  STATIC_REQUIRE(first({model, fsdp, default_dtype}) == violation::r17_default_dtype_not_after_model);
  STATIC_REQUIRE(first({model, recompute, lora, recompute}) == violation::r18_two_recomputes);
  STATIC_REQUIRE(first({model, fsdp, recompute}) == violation::r18_recompute_after_strategy);
  STATIC_REQUIRE(first({model, sequence_parallel, lora, sequence_parallel}) == violation::r20_two_sequence_parallels);
  STATIC_REQUIRE(first({model, ddp, sequence_parallel}) == violation::r20_sequence_parallel_after_strategy);
  STATIC_REQUIRE(first({model, seeded, recompute, sequence_parallel, lora, fsdp}) == violation::none);
  STATIC_REQUIRE(first({model, recompute, default_dtype}) == violation::r17_default_dtype_not_after_model);
  STATIC_REQUIRE(first({model, seeded, default_dtype, pretrained, lora, fsdp}) == violation::none);
  STATIC_REQUIRE(first({model, pretrained, pretrained}) == violation::r19_two_pretrained);
  STATIC_REQUIRE(first({model, lora, pretrained}) == violation::r19_pretrained_after_lora);
  STATIC_REQUIRE(first({model, ddp, pretrained}) == violation::r19_pretrained_after_strategy);
  STATIC_REQUIRE(first({model, pretrained, seeded}) == violation::r4_seeded_not_after_model);
  STATIC_REQUIRE(first({model, seeded, pretrained, quantized, lora, fsdp}) == violation::none);
  STATIC_REQUIRE(first({model, quantized}) == violation::none);  // lora may still follow
  STATIC_REQUIRE(first({model, quantized, quantized}) == violation::r21_two_quantized);
  STATIC_REQUIRE(first({model, quantized, pretrained}) == violation::r21_quantized_before_pretrained);
  STATIC_REQUIRE(first({model, lora, quantized}) == violation::r21_quantized_after_lora);
  STATIC_REQUIRE(first({model, lora, ddp, quantized}) == violation::r21_quantized_after_strategy);
  STATIC_REQUIRE(first({model, quantized, ddp}) == violation::r21_quantized_without_lora);
  STATIC_REQUIRE(loom::first_violation_when_built(std::array{model, quantized}) ==
                 violation::r21_quantized_without_lora);
  STATIC_REQUIRE(loom::first_violation_when_built(std::array{model, quantized, lora}) == violation::none);
  STATIC_REQUIRE(first({model, seeded, recompute, tensor_parallel, lora, fsdp}) == violation::none);
  STATIC_REQUIRE(first({model, sequence_parallel, tensor_parallel, ddp}) == violation::none);  // R22 on values
  STATIC_REQUIRE(first({model, tensor_parallel, lora, tensor_parallel}) == violation::r22_two_tensor_parallels);
  STATIC_REQUIRE(first({model, ddp, tensor_parallel}) == violation::r22_tensor_parallel_after_strategy);
  STATIC_REQUIRE(first({model, quantized, tensor_parallel, lora}) == violation::r22_with_quantized);
  STATIC_REQUIRE(first({model, tensor_parallel, quantized, lora}) == violation::r22_with_quantized);
}

TEST_CASE("the first violation from the left wins", "[dsl][rules]") {
  STATIC_REQUIRE(first({model, lora, seeded, ddp, ddp}) == violation::r4_seeded_not_after_model);
  STATIC_REQUIRE(first({model, ddp, lora, lora}) == violation::r3_lora_after_ddp);
}

TEST_CASE("a fragment is checked as the stages after a model", "[dsl][rules]") {
  constexpr std::array ok{seeded, trainable, ddp};  // lora may come from the plan it joins
  constexpr std::array late_seed{lora, seeded};
  constexpr std::array with_model{lora, model};
  constexpr std::array trainable_then_lora{trainable, lora};
  STATIC_REQUIRE(loom::first_violation_in_fragment(ok) == violation::none);
  STATIC_REQUIRE(loom::first_violation_in_fragment(late_seed) == violation::r4_seeded_not_after_model);
  STATIC_REQUIRE(loom::first_violation_in_fragment(with_model) == violation::r1_model_not_first);
  STATIC_REQUIRE(loom::first_violation_in_fragment(trainable_then_lora) == violation::r9_trainable_without_lora);
}

TEST_CASE("every sentence names its rule and reads 'loom R<n>: what: fix'", "[dsl][rules]") {
  using v = violation;
  STATIC_REQUIRE(loom::rule_of(v::none) == 0);
  STATIC_REQUIRE(loom::sentence(v::none).empty());
  const std::vector<std::pair<violation, int>> rules{
      {v::r1_no_model, 1},
      {v::r1_model_not_first, 1},
      {v::r1_two_models, 1},
      {v::r2_two_strategies, 2},
      {v::r2_seeded_after_strategy, 2},
      {v::r3_lora_after_ddp, 3},
      {v::r3_lora_after_fsdp, 3},
      {v::r3_lora_after_strategy, 3},
      {v::r3_trainable_after_ddp, 3},
      {v::r3_trainable_after_fsdp, 3},
      {v::r3_trainable_after_strategy, 3},
      {v::r4_seeded_twice, 4},
      {v::r4_seeded_not_after_model, 4},
      {v::r5_rank_not_positive, 5},
      {v::r5_alpha_not_positive, 5},
      {v::r5_dropout_out_of_range, 5},
      {v::r5_no_targets, 5},
      {v::r5_empty_target, 5},
      {v::r5_duplicate_target, 5},
      {v::r5_empty_exclude, 5},
      {v::r5_duplicate_exclude, 5},
      {v::r5_all_linear_not_alone, 5},
      {v::r5_empty_module_to_save, 5},
      {v::r5_duplicate_module_to_save, 5},
      {v::r5_empty_pattern_key, 5},
      {v::r5_duplicate_pattern_key, 5},
      {v::r5_rank_pattern_value, 5},
      {v::r5_alpha_pattern_value, 5},
      {v::r6_two_loras, 6},
      {v::r9_trainable_without_lora, 9},
      {v::r10_trainable_twice, 10},
      {v::r11_no_patterns, 11},
      {v::r11_empty_pattern, 11},
      {v::r11_duplicate_pattern, 11},
      {v::r12_too_many_targets, 12},
      {v::r12_too_many_pattern_keys, 12},
  };
  for (const auto& [code, id] : rules) {
    const std::string_view text = loom::sentence(code);
    INFO(text);
    CHECK(loom::rule_of(code) == id);
    CHECK(text.starts_with("loom R" + std::to_string(id) + ": "));
    CHECK(text.find(": ", text.find(": ") + 2) != std::string_view::npos);  // what is wrong: the fix
    CHECK(
        std::ranges::all_of(text, [](char c) { return static_cast<unsigned char>(c) < 0x80; }));  // g++ prints it as is
  }
}

TEST_CASE("check_stages throws plan_error with the same sentence", "[dsl][rules]") {
  const std::vector<loom::stage_kind> from_a_file{model, ddp, lora};
  try {
    loom::check_stages(from_a_file);
    FAIL("check_stages accepted lora after ddp");
  } catch (const loom::plan_error& error) {
    CHECK(error.code() == violation::r3_lora_after_ddp);
    CHECK(error.rule() == 3);
    CHECK(std::string_view(error.what()) == loom::sentence(violation::r3_lora_after_ddp));
  }
  CHECK_THROWS_AS(loom::check_stages(std::vector{lora}), std::invalid_argument);
  CHECK_NOTHROW(loom::check_stages(std::vector{model, seeded, lora, trainable, fsdp}));
}

TEST_CASE("a plan's kinds pass the same rules", "[dsl][rules]") {
  struct Model {};
  constexpr auto plan = loom::model<Model>() | loom::seeded(3) | loom::lora(8) | loom::ddp();
  STATIC_REQUIRE(loom::first_violation(plan.kinds) == violation::none);
  STATIC_REQUIRE(plan.kinds == std::array{model, seeded, lora, ddp});
}

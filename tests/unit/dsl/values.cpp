// The value rules (R5, R11, R12): constexpr functions, consteval stage functions, and the
// run-time twins that throw plan_error with the same sentence.
#include <loom/dsl.hpp>

#include <catch2/catch_test_macros.hpp>

#include <cstddef>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace {

using loom::violation;

constexpr loom::target_list attention{"q_proj", "v_proj"};

struct Model {};

// Runs f, expecting plan_error with the given code; returns what() for further checks.
template <class F>
std::string plan_error_of(F f, violation expected) {
  try {
    f();
  } catch (const loom::plan_error& error) {
    CHECK(error.code() == expected);
    CHECK(std::string_view(error.what()) == loom::sentence(expected));
    return error.what();
  }
  FAIL("no plan_error");
  return {};
}

}  // namespace

TEST_CASE("lora_violation: each R5 check", "[dsl][values]") {
  using loom::lora_violation;
  STATIC_REQUIRE(lora_violation(8, attention, {}) == violation::none);
  STATIC_REQUIRE(lora_violation(0, attention, {}) == violation::r5_rank_not_positive);
  STATIC_REQUIRE(lora_violation(-4, attention, {}) == violation::r5_rank_not_positive);
  STATIC_REQUIRE(lora_violation(8, attention, {.alpha = 0.0}) == violation::r5_alpha_not_positive);
  STATIC_REQUIRE(lora_violation(8, attention, {.alpha = -1.0}) == violation::r5_alpha_not_positive);
  STATIC_REQUIRE(lora_violation(8, attention, {.alpha = 0.5}) == violation::none);
  STATIC_REQUIRE(lora_violation(8, attention, {.dropout = 1.0}) == violation::r5_dropout_out_of_range);
  STATIC_REQUIRE(lora_violation(8, attention, {.dropout = -0.1}) == violation::r5_dropout_out_of_range);
  STATIC_REQUIRE(lora_violation(8, attention, {.dropout = 0.99}) == violation::none);
  STATIC_REQUIRE(lora_violation(8, {}, {}) == violation::r5_no_targets);
  STATIC_REQUIRE(lora_violation(8, {"q_proj", ""}, {}) == violation::r5_empty_target);
  STATIC_REQUIRE(lora_violation(8, {"q_proj", "q_proj"}, {}) == violation::r5_duplicate_target);
  // A name and a pattern with the same text are different targets.
  STATIC_REQUIRE(lora_violation(8, {"q_proj", loom::pattern("q_proj")}, {}) == violation::none);
  STATIC_REQUIRE(lora_violation(8, attention, {.exclude = {""}}) == violation::r5_empty_exclude);
  STATIC_REQUIRE(lora_violation(8, attention, {.exclude = {"head", "head"}}) == violation::r5_duplicate_exclude);
}

TEST_CASE("lora_violation rejects NaN", "[dsl][values]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  CHECK(loom::lora_violation(8, attention, {.alpha = nan}) == violation::r5_alpha_not_positive);
  CHECK(loom::lora_violation(8, attention, {.dropout = nan}) == violation::r5_dropout_out_of_range);
}

TEST_CASE("PEFT's options: all-linear alone, pattern keys and values", "[dsl][values]") {
  using loom::lora_violation;
  STATIC_REQUIRE(lora_violation(8, {loom::all_linear}, {}) == violation::none);
  STATIC_REQUIRE(lora_violation(8, {loom::all_linear, "lm_head"}, {}) == violation::r5_all_linear_not_alone);
  STATIC_REQUIRE(lora_violation(8, attention, {.exclude = {loom::all_linear}}) == violation::r5_all_linear_not_alone);
  STATIC_REQUIRE(lora_violation(8, attention,
                                {.use_rslora = true,
                                 .rank_pattern = {{"q_proj", 4}, {"v_.*", 2}},
                                 .alpha_pattern = {{"q_proj", 0.5}}}) == violation::none);
  STATIC_REQUIRE(lora_violation(8, attention, {.rank_pattern = {{"q_proj", 0}}}) == violation::r5_rank_pattern_value);
  STATIC_REQUIRE(lora_violation(8, attention, {.rank_pattern = {{"q_proj", 2.5}}}) == violation::r5_rank_pattern_value);
  STATIC_REQUIRE(lora_violation(8, attention, {.alpha_pattern = {{"q_proj", -1}}}) ==
                 violation::r5_alpha_pattern_value);
  STATIC_REQUIRE(lora_violation(8, attention, {.alpha_pattern = {{"", 1}}}) == violation::r5_empty_pattern_key);
  STATIC_REQUIRE(lora_violation(8, attention, {.modules_to_save = {"lm_head"}}) == violation::none);
  STATIC_REQUIRE(lora_violation(8, attention, {.modules_to_save = {""}}) == violation::r5_empty_module_to_save);
  STATIC_REQUIRE(lora_violation(8, attention, {.modules_to_save = {"lm_head", "lm_head"}}) ==
                 violation::r5_duplicate_module_to_save);
  STATIC_REQUIRE(lora_violation(8, attention, {.modules_to_save = {loom::all_linear}}) ==
                 violation::r5_all_linear_not_alone);
  STATIC_REQUIRE(lora_violation(8, attention, {.rank_pattern = {{"q_proj", 2}, {"q_proj", 4}}}) ==
                 violation::r5_duplicate_pattern_key);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  CHECK(lora_violation(8, attention, {.alpha_pattern = {{"q_proj", nan}}}) == violation::r5_alpha_pattern_value);
  CHECK(lora_violation(8, attention, {.rank_pattern = {{"q_proj", nan}}}) == violation::r5_rank_pattern_value);

  // rsLoRA scales by alpha / √rank; the text says what is set beyond plain LoRA, and only that.
  constexpr loom::lora_stage rs =
      loom::lora(16, {loom::all_linear},
                 {.alpha = 8, .use_rslora = true, .rank_pattern = {{"o_proj", 4}}, .alpha_pattern = {{"up_proj", 2}}});
  STATIC_REQUIRE(rs.scaling() == 2.0);
  CHECK(
      rs.describe() ==
      "lora(rank=16, alpha=8, dropout=0, targets=[all-linear], exclude=[], use_rslora=true, rank_pattern={o_proj: 4}, "
      "alpha_pattern={up_proj: 2})");
  CHECK(loom::lora(4, {"q_proj"}, {.modules_to_save = {"lm_head"}}).describe() ==
        "lora(rank=4, alpha=4, dropout=0, targets=[q_proj], exclude=[], modules_to_save=[lm_head])");
  CHECK(loom::lora(4).describe() ==
        "lora(rank=4, alpha=4, dropout=0, targets=[q_proj, k_proj, v_proj, o_proj, to_q, "
        "to_k, to_v, to_out, to_qkv, to_gate_compress], exclude=[])");

  loom::lora_pattern_list full;
  for (int i = 0; i < 16; ++i) {
    std::string key = "l";
    key += std::to_string(i);
    full.push_back({key, 2});
  }
  plan_error_of([&] { full.push_back({"one_more", 2}); }, violation::r12_too_many_pattern_keys);
}

TEST_CASE("lora(...) with constants, lora_stage::checked with run-time values", "[dsl][values]") {
  constexpr loom::lora_stage fixed = loom::lora(16, {"q_proj", "v_proj"}, {.alpha = 8, .dropout = 0.1});
  STATIC_REQUIRE(fixed.rank() == 16);
  STATIC_REQUIRE(fixed.alpha() == 8);
  STATIC_REQUIRE(fixed.scaling() == 0.5);
  STATIC_REQUIRE(fixed.dropout() == 0.1);
  STATIC_REQUIRE(fixed.targets() == attention);
  STATIC_REQUIRE(fixed.exclude().empty());
  STATIC_REQUIRE(loom::lora(4).targets() == loom::default_targets);
  // FastVideo's DEFAULT_LORA_TARGET_MODULES, in its order.
  STATIC_REQUIRE(loom::default_targets == loom::target_list{"q_proj", "k_proj", "v_proj", "o_proj", "to_q", "to_k",
                                                            "to_v", "to_out", "to_qkv", "to_gate_compress"});
  STATIC_REQUIRE(loom::lora(4).alpha() == 4);  // alpha defaults to the rank

  const int rank = static_cast<int>(std::string("12").size()) * 6;  // a value the compiler cannot see
  const loom::lora_stage from_config = loom::lora_stage::checked(rank, {"to_q"}, {.alpha = 6});
  CHECK(from_config.rank() == 12);
  CHECK(from_config.scaling() == 0.5);

  plan_error_of([&] { (void)loom::lora_stage::checked(rank - 12); }, violation::r5_rank_not_positive);
  plan_error_of([&] { (void)loom::lora_stage::checked(rank, {"to_q", "to_q"}); }, violation::r5_duplicate_target);
  plan_error_of([&] { (void)loom::lora_stage::checked(rank, attention, {.dropout = 1}); },
                violation::r5_dropout_out_of_range);
}

TEST_CASE("trainable: R11", "[dsl][values]") {
  STATIC_REQUIRE(loom::trainable_violation({"norm"}) == violation::none);
  STATIC_REQUIRE(loom::trainable_violation({}) == violation::r11_no_patterns);
  STATIC_REQUIRE(loom::trainable_violation({"norm", ""}) == violation::r11_empty_pattern);
  STATIC_REQUIRE(loom::trainable_violation({"norm", "norm"}) == violation::r11_duplicate_pattern);
  STATIC_REQUIRE(loom::trainable({"norm", "lm_head"}).patterns().size() == 2);
  plan_error_of([] { (void)loom::trainable_stage::checked({}); }, violation::r11_no_patterns);
}

TEST_CASE("target_list: capacity (R12) and run-time text that outlives its source", "[dsl][values]") {
  loom::target_list list;
  for (int i = 0; i != static_cast<int>(loom::target_list::capacity); ++i) {
    std::string name = "layer" + std::to_string(i);
    list.push_back(name);  // name dies at the end of the iteration
  }
  CHECK(list.size() == loom::target_list::capacity);
  CHECK(list[15].text == "layer15");
  CHECK(list[0].text == "layer0");
  CHECK(list[0].kind == loom::target_kind::name);
  plan_error_of([&] { list.push_back("one_more"); }, violation::r12_too_many_targets);

  const std::vector<std::string> from_file{"blocks\\.[0-9]+\\.attn"};
  loom::target_list patterns;
  patterns.push_back(loom::pattern(from_file[0]));
  CHECK(patterns[0].kind == loom::target_kind::pattern);
  CHECK(patterns[0].text.data() != from_file[0].data());  // a copy, not a view of the caller's string
}

TEST_CASE("mixed_precision_violation and default_dtype: each R16 and R17 check", "[dsl][values]") {
  using loom::mixed_precision_violation;
  STATIC_REQUIRE(mixed_precision_violation({}) == violation::none);
  STATIC_REQUIRE(mixed_precision_violation({.reduce = loom::bf16, .output = loom::fp32}) == violation::none);
  STATIC_REQUIRE(mixed_precision_violation({.param = loom::dtype::int8}) == violation::r16_param_not_floating);
  STATIC_REQUIRE(mixed_precision_violation({.param = loom::fp32}) == violation::r16_param_full_precision);
  STATIC_REQUIRE(mixed_precision_violation({.param = loom::fp64}) == violation::r16_param_full_precision);
  STATIC_REQUIRE(mixed_precision_violation({.param = loom::fp16}) == violation::r16_fp16_without_loss_scaling);
  STATIC_REQUIRE(mixed_precision_violation({.reduce = loom::dtype::int32}) == violation::r16_reduce_not_floating);
  STATIC_REQUIRE(mixed_precision_violation({.output = loom::dtype::boolean}) == violation::r16_output_not_floating);
  plan_error_of([] { (void)loom::mixed_precision_stage::checked({.param = loom::fp16}); },
                violation::r16_fp16_without_loss_scaling);
  plan_error_of([] { (void)loom::default_dtype_stage::checked(loom::dtype::uint8); }, violation::r17_not_floating);
  CHECK(loom::default_dtype_stage::checked(loom::fp16).type() == loom::fp16);
}

TEST_CASE("recompute: which units every k chooses, and R18's value check", "[dsl][values]") {
  constexpr loom::recompute_options every{};
  STATIC_REQUIRE(every.recomputes(0) && every.recomputes(1) && every.recomputes(7));
  constexpr loom::recompute_options second{.every = 2};  // torchtitan's layer selective "2": units 2, 4, ...
  STATIC_REQUIRE(!second.recomputes(0) && second.recomputes(1) && !second.recomputes(2) && second.recomputes(3));
  constexpr loom::recompute_options third{.every = 3};
  STATIC_REQUIRE(!third.recomputes(0) && !third.recomputes(1) && third.recomputes(2) && third.recomputes(5));
  plan_error_of([] { (void)loom::recompute_stage::checked({.every = 0}); }, violation::r18_every_zero);
  CHECK(loom::recompute_stage::checked({.every = 4}).settings().every == 4);
}

TEST_CASE("sequence_parallel: R20's value check", "[dsl][values]") {
  plan_error_of([] { (void)loom::sequence_parallel_stage::checked({.size = 0}); }, violation::r20_size_zero);
  CHECK(loom::sequence_parallel_stage::checked({.size = 3}).settings().size == 3);
  STATIC_REQUIRE(loom::sequence_parallel(2).settings().size == 2);
  CHECK(loom::sequence_parallel(4).describe() == "sequence_parallel(size=4)");
}

TEST_CASE("tensor_parallel: R22's value checks", "[dsl][values]") {
  plan_error_of([] { (void)loom::tensor_parallel_stage::checked({.size = 0}); }, violation::r22_size_zero);
  CHECK(loom::tensor_parallel_stage::checked({.size = 3}).settings().size == 3);
  STATIC_REQUIRE(loom::tensor_parallel(2).settings().size == 2);
  CHECK(loom::tensor_parallel(4).describe() == "tensor_parallel(size=4)");

  // Both splits at once: a constant plan does not compile (tests/compile_fail), one made at run time
  // throws where it is made; a group of one, either way, splits nothing.
  STATIC_REQUIRE((loom::model<Model>() | loom::sequence_parallel(1) | loom::tensor_parallel(2)).values_violation() ==
                 violation::none);
  STATIC_REQUIRE((loom::model<Model>() | loom::sequence_parallel(2) | loom::tensor_parallel(1)).values_violation() ==
                 violation::none);
  const std::size_t from_a_file = 2;
  const auto sequence = loom::sequence_parallel_stage::checked({.size = from_a_file});
  const auto tensor = loom::tensor_parallel_stage::checked({.size = from_a_file});
  plan_error_of([&] { (void)(loom::model<Model>() | sequence | tensor | loom::fsdp()); },
                violation::r22_with_sequence_parallel);
  // A closure joins the plan later, and is checked there.
  const auto split_both = sequence | tensor;
  plan_error_of([&] { (void)(loom::model<Model>() | split_both); }, violation::r22_with_sequence_parallel);
  loom::stage_list stages;
  stages.add(sequence);
  CHECK(loom::tensor_parallel_violation(stages) == violation::none);
  stages.add(tensor);
  CHECK(loom::tensor_parallel_violation(stages) == violation::r22_with_sequence_parallel);
}

TEST_CASE("data_parallel: the ranks of a sequence or tensor-parallel group share a data-parallel rank",
          "[dsl][values]") {
  constexpr auto tensor_split = loom::model<Model>() | loom::tensor_parallel(2) | loom::fsdp();
  STATIC_REQUIRE(loom::data_parallel(tensor_split, 5, 8).rank == 2);
  STATIC_REQUIRE(loom::data_parallel(tensor_split, 5, 8).world_size == 4);
  constexpr auto sequence_split = loom::model<Model>() | loom::sequence_parallel(4) | loom::tensor_parallel(1);
  STATIC_REQUIRE(loom::data_parallel(sequence_split, 5, 8).rank == 1);
  STATIC_REQUIRE(loom::data_parallel(sequence_split, 5, 8).world_size == 2);
  constexpr auto unsplit = loom::model<Model>() | loom::ddp();
  STATIC_REQUIRE(loom::data_parallel(unsplit, 5, 8).rank == 5);
  STATIC_REQUIRE(loom::data_parallel(unsplit, 5, 8).world_size == 8);
  // A group that does not divide the world leaves the world's place: the build names that.
  STATIC_REQUIRE(loom::data_parallel(tensor_split, 2, 3).rank == 2);
  STATIC_REQUIRE(loom::data_parallel(tensor_split, 2, 3).world_size == 3);
  // A run file's stages, and the sequence_parallel stage alone (the overload of before).
  loom::stage_list stages;
  stages.add(loom::tensor_parallel_stage::checked({.size = 4}));
  CHECK(loom::data_parallel(stages, 6, 8).rank == 1);
  CHECK(loom::data_parallel(stages, 6, 8).world_size == 2);
  STATIC_REQUIRE(loom::data_parallel(loom::sequence_parallel(2), 3, 4).rank == 1);
  STATIC_REQUIRE(loom::data_parallel(std::nullopt, 3, 4).rank == 3);
}

TEST_CASE("dtype names: loom's and PyTorch's", "[dsl][values]") {
  STATIC_REQUIRE(loom::dtype_named("bf16") == loom::bf16);
  STATIC_REQUIRE(loom::dtype_named("bfloat16") == loom::bf16);
  STATIC_REQUIRE(loom::dtype_named("float32") == loom::fp32);
  STATIC_REQUIRE(loom::dtype_named("int8") == loom::dtype::int8);
  STATIC_REQUIRE(!loom::dtype_named("float"));
  STATIC_REQUIRE(loom::name_of(loom::fp16) == "fp16");
  for (const loom::dtype_name& entry : loom::dtype_names) {
    CHECK(loom::dtype_named(entry.short_name) == entry.type);
    CHECK(loom::name_of(entry.type) == entry.short_name);
  }
}

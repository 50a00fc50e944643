// describe(): one stage a line, every option spelled out. The format is documented in docs/dsl.md
// and carried by checkpoints and logs, so these strings are the contract.
#include <loom/dsl.hpp>

#include <catch2/catch_test_macros.hpp>

#include <string>
#include <string_view>

namespace demo {
struct TinyGpt {};
}  // namespace demo

TEST_CASE("describe a full plan", "[dsl][describe]") {
  const auto plan =
      loom::model<demo::TinyGpt>(64) | loom::seeded(42) | loom::lora(16, {"q_proj", "v_proj"}) | loom::ddp();
  CHECK(plan.describe() ==
        "model<demo::TinyGpt>(1 arg)\n"
        "seeded(42)\n"
        "lora(rank=16, alpha=16, dropout=0, targets=[q_proj, v_proj], exclude=[])\n"
        "ddp(bucket_cap_mb=25, broadcast_buffers=false, find_unused_parameters=false, "
        "gradient_as_bucket_view=false, static_graph=false)\n");
}

TEST_CASE("describe fills in defaults, the strategy included", "[dsl][describe]") {
  const auto plan =
      loom::model<demo::TinyGpt>() |
      loom::lora(8, loom::default_targets,
                 {.alpha = 0.5, .dropout = 0.05, .exclude = {"lm_head", loom::pattern("blocks\\.0\\..*")}}) |
      loom::trainable({"norm", loom::pattern(".*\\.bias")});
  CHECK(plan.describe() ==
        "model<demo::TinyGpt>(0 args)\n"
        "lora(rank=8, alpha=0.5, dropout=0.05, targets=[q_proj, k_proj, v_proj, o_proj, to_q, to_k, to_v, "
        "to_out, to_qkv, to_gate_compress], exclude=[lm_head, pattern(\"blocks\\.0\\..*\")])\n"
        "trainable(patterns=[norm, pattern(\".*\\.bias\")])\n"
        "local()\n");
}

TEST_CASE("describe the other strategies and a closure", "[dsl][describe]") {
  CHECK((loom::model<demo::TinyGpt>(1, 2) | loom::fsdp()).describe() ==
        "model<demo::TinyGpt>(2 args)\nfsdp(reshard_after_forward=true, bucket_cap_mb=25, shard_group_size=0, "
        "accumulate_unsharded=false, offload=false)\n");
  CHECK((loom::model<demo::TinyGpt>() | loom::local()).describe() == "model<demo::TinyGpt>(0 args)\nlocal()\n");
  CHECK((loom::seeded(7) | loom::fsdp({.reshard_after_forward = false})).describe() ==
        "seeded(7)\nfsdp(reshard_after_forward=false, bucket_cap_mb=25, shard_group_size=0, "
        "accumulate_unsharded=false, offload=false)\n");
}

TEST_CASE("describe_state leaves out the layout options, which a checkpoint resumes across", "[dsl][describe]") {
  constexpr auto hybrid = loom::model<demo::TinyGpt>() | loom::seeded(3) | loom::fsdp({.shard_group_size = 2});
  CHECK(hybrid.describe() ==
        "model<demo::TinyGpt>(0 args)\nseeded(3)\nfsdp(reshard_after_forward=true, bucket_cap_mb=25, "
        "shard_group_size=2, accumulate_unsharded=false, offload=false)\n");
  CHECK(hybrid.describe_state() ==
        "model<demo::TinyGpt>(0 args)\nseeded(3)\nfsdp(reshard_after_forward=true, bucket_cap_mb=25)\n");
  CHECK(hybrid.describe_state() == (loom::model<demo::TinyGpt>() | loom::seeded(3) | loom::fsdp()).describe_state());
  // Offload holds the same state elsewhere: a layout option too.
  CHECK((loom::model<demo::TinyGpt>() | loom::seeded(3) | loom::fsdp({.offload = true})).describe_state() ==
        (loom::model<demo::TinyGpt>() | loom::seeded(3) | loom::fsdp()).describe_state());
  // A state option still counts.
  CHECK(
      hybrid.describe_state() !=
      (loom::model<demo::TinyGpt>() | loom::seeded(3) | loom::fsdp({.reshard_after_forward = false})).describe_state());
  constexpr auto replicated = loom::model<demo::TinyGpt>() | loom::ddp();
  CHECK(replicated.describe_state() == replicated.describe());
}

TEST_CASE("describe the recompute stage", "[dsl][describe]") {
  constexpr auto plan = loom::model<demo::TinyGpt>() | loom::recompute({.every = 2}) | loom::ddp();
  CHECK(plan.describe() ==
        "model<demo::TinyGpt>(0 args)\n"
        "recompute(every=2)\n"
        "ddp(bucket_cap_mb=25, broadcast_buffers=false, find_unused_parameters=false, "
        "gradient_as_bucket_view=false, static_graph=false)\n");
  CHECK(loom::recompute().describe() == "recompute(every=1)");
  STATIC_REQUIRE(plan.find<loom::recompute_stage>()->settings().every == 2);
  STATIC_REQUIRE(!(loom::model<demo::TinyGpt>() | loom::ddp()).find<loom::recompute_stage>());
}

TEST_CASE("describe the tensor_parallel stage", "[dsl][describe]") {
  constexpr auto plan = loom::model<demo::TinyGpt>() | loom::tensor_parallel(2) | loom::lora(8, {"q_proj"}) |
                        loom::fsdp({.reshard_after_forward = false});
  const std::string stages =
      "tensor_parallel(size=2)\nlora(rank=8, alpha=8, dropout=0, targets=[q_proj], exclude=[])\n";
  CHECK(plan.describe() ==
        "model<demo::TinyGpt>(0 args)\n" + stages + loom::fsdp({.reshard_after_forward = false}).describe() + "\n");
  CHECK(plan.stage_values().describe() == stages);
  STATIC_REQUIRE(plan.find<loom::tensor_parallel_stage>()->settings().size == 2);
  STATIC_REQUIRE(!(loom::model<demo::TinyGpt>() | loom::ddp()).find<loom::tensor_parallel_stage>());
}

TEST_CASE("a type's name, read at compile time", "[dsl][describe]") {
  STATIC_REQUIRE(loom::detail::type_name<demo::TinyGpt>() == "demo::TinyGpt");
  STATIC_REQUIRE(loom::detail::type_name<int>() == "int");
}

TEST_CASE("describe the dtype stages", "[dsl][describe]") {
  constexpr auto plan = loom::model<demo::TinyGpt>() | loom::seeded(1) | loom::default_dtype(loom::bf16) |
                        loom::mixed_precision({.output = loom::fp32}) | loom::fsdp();
  CHECK(plan.describe() ==
        "model<demo::TinyGpt>(0 args)\n"
        "seeded(1)\n"
        "default_dtype(bf16)\n"
        "mixed_precision(param=bf16, reduce=fp32, output=fp32, cast_forward_inputs=true)\n"
        "fsdp(reshard_after_forward=true, bucket_cap_mb=25, shard_group_size=0, accumulate_unsharded=false, "
        "offload=false)\n");
  CHECK(loom::mixed_precision().describe() ==
        "mixed_precision(param=bf16, reduce=fp32, output=none, cast_forward_inputs=true)");
  STATIC_REQUIRE(plan.find<loom::default_dtype_stage>()->type() == loom::bf16);
  STATIC_REQUIRE(plan.find<loom::mixed_precision_stage>()->settings().reduce == loom::fp32);
  STATIC_REQUIRE(!(loom::model<demo::TinyGpt>() | loom::ddp()).find<loom::mixed_precision_stage>());
}

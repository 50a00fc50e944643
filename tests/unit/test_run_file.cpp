// Plans from a run file: the same rules and sentences as the compiler (each compile-fail case whose
// plan a file can express, read from tests/run_files/<case>.json and checked against the case's own
// "// expect:" line), the same describe() as the typed plan, overrides, the file's own errors, and a
// job built from a file with its module typed.
#include <loom/config/run_file.hpp>
#include <loom/loom.hpp>
#include <models/tiny_gpt.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

using Catch::Matchers::ContainsSubstring;

namespace {

namespace fs = std::filesystem;

const fs::path source = LOOM_SOURCE_DIR;
constexpr models::tiny_gpt_config small{.vocab = 32, .d = 16, .layers = 2, .heads = 2, .ctx = 8};

// The regular expression a compile-fail case expects of the compiler.
std::string expected_of(const std::string& name) {
  std::ifstream in(source / "tests" / "compile_fail" / (name + ".cpp"));
  std::string line;
  std::getline(in, line);
  const std::string marker = "// expect: ";
  REQUIRE(line.starts_with(marker));
  return line.substr(marker.size());
}

fs::path written(const std::string& name, const std::string& text, const std::string& extension = ".json") {
  const fs::path file = fs::temp_directory_path() / ("loom-test-run-file-" + name + extension);
  std::ofstream(file) << text;
  return file;
}

// Each field a strategy's options struct lists is a run-file key: set to a value other than its
// default, it reaches the stage and its description, and the reader's list of keys names it.
template <class Stage>
void check_every_option_is_read() {
  using options = typename Stage::options_type;
  const std::string strategy(Stage::name);
  std::string keys = "name";
  std::apply(
      [&](const auto&... field) {
        ((keys += ", " + std::string(field.name)), ...);
        (
            [&] {
              const options defaults{};
              auto expected = defaults.*field.member;
              if constexpr (std::is_same_v<decltype(expected), bool>) {
                expected = !expected;
              } else {
                expected += 7;
              }
              const std::string value = loom::detail::to_text(expected);
              CAPTURE(strategy, field.name, value);
              const fs::path file = written("option", R"({"plan": [{"strategy": ")" + strategy + R"("}]})");
              const loom::run_stages stages = loom::read_run_stages(
                  file, std::vector<std::string>{"strategy." + std::string(field.name) + "=" + value});
              const auto& stage = std::get<Stage>(stages.strategy.value());
              CHECK(stage.settings().*field.member == expected);
              CHECK_THAT(stage.describe(), ContainsSubstring(std::string(field.name) + "=" + value));
            }(),
            ...);
      },
      options::fields());
  const fs::path file = written("option", R"({"plan": [{"strategy": {"name": ")" + strategy + R"(", "bogus": 1}}]})");
  CHECK_THROWS_WITH(loom::read_run_stages(file),
                    ContainsSubstring("strategy.bogus: unknown key; " + strategy + " takes " + keys));
}

}  // namespace

TEST_CASE("a strategy's options are read from run files as their fields() describe them", "[run_file]") {
  check_every_option_is_read<loom::ddp_stage>();
  check_every_option_is_read<loom::fsdp_stage>();
  CHECK_THROWS_WITH(
      loom::read_run_stages(written("negative", R"({"plan": [{"strategy": {"name": "ddp", "bucket_cap_mb": -1}}]})")),
      ContainsSubstring("strategy.bucket_cap_mb: give a whole number, 0 or more"));
}

TEST_CASE("a run file breaks the rules with the compiler's sentences", "[run_file]") {
  const std::string name = GENERATE(
      "r2_stage_after_strategy", "r2_two_strategies", "r3_lora_after_ddp", "r3_trainable_after_fsdp", "r4_seeded_twice",
      "r4_seeded_not_after_model", "r5_rank_zero", "r5_negative_alpha", "r5_dropout_one", "r5_empty_targets",
      "r5_empty_target_name", "r5_duplicate_target", "r5_duplicate_exclude", "r5_rank_pattern_zero",
      "r5_alpha_pattern_negative", "r5_empty_pattern_key", "r5_all_linear_not_alone", "r12_too_many_pattern_keys",
      "r5_empty_module_to_save", "r5_duplicate_module_to_save", "r6_two_loras", "r9_trainable_without_lora",
      "r10_trainable_twice", "r11_no_patterns", "r12_too_many_targets", "r15_two_mixed_precisions",
      "r15_mixed_precision_after_fsdp", "r16_param_int8", "r16_param_fp32", "r16_param_fp16", "r16_reduce_bool",
      "r16_output_int64", "r17_default_dtype_int32", "r17_default_dtype_twice", "r17_default_dtype_after_lora",
      "r18_two_recomputes", "r18_recompute_after_fsdp", "r18_every_zero", "r19_two_pretrained",
      "r19_pretrained_after_lora", "r19_pretrained_after_fsdp", "r21_two_quantized", "r21_quantized_before_pretrained",
      "r21_quantized_after_lora", "r21_quantized_after_fsdp", "r21_quantized_without_lora", "r21_block_size",
      "r22_two_tensor_parallels", "r22_tensor_parallel_after_ddp", "r22_size_zero", "r22_with_sequence_parallel",
      "r22_with_quantized");
  CAPTURE(name);
  const fs::path file = source / "tests" / "run_files" / (name + ".json");
  try {
    (void)loom::plan_from_file(loom::model<models::TinyGpt>(small), file);
    FAIL("the run file was accepted");
  } catch (const loom::plan_error& error) {
    CHECK(std::regex_search(error.what(), std::regex(expected_of(name))));
  }
}

TEST_CASE("a plan from a file describes itself as the typed plan does", "[run_file]") {
  const auto from_file = loom::plan_from_file(loom::model<models::TinyGpt>(small),
                                              source / "tests" / "run_files" / "tiny_gpt_lora_fsdp.json");
  const auto typed = loom::model<models::TinyGpt>(small) | loom::seeded(7) |
                     loom::lora(4, {"q_proj", "v_proj"}, {.alpha = 8}) | loom::trainable({"head"}) |
                     loom::fsdp({.reshard_after_forward = false});
  CHECK(from_file.describe() == typed.describe());

  const auto local_only =
      loom::plan_from_file(loom::model<models::TinyGpt>(small), written("seeded", R"({"plan": [{"seeded": 3}]})"));
  CHECK(local_only.describe() == (loom::model<models::TinyGpt>(small) | loom::seeded(3)).describe());
}

TEST_CASE("quantized(...) from a run file, and transformers' BitsAndBytesConfig onto it", "[run_file]") {
  const auto typed = loom::model<models::TinyGpt>(small) | loom::quantized({.format = loom::nf4, .block_size = 128}) |
                     loom::lora(4) | loom::fsdp();
  const auto from_file = loom::plan_from_file(
      loom::model<models::TinyGpt>(small),
      written("quantized", R"({"plan": [{"quantized": {"format": "nf4", "block_size": 128}}, {"lora": {"rank": 4}},
                                        {"strategy": "fsdp"}]})"));
  CHECK(from_file.describe() == typed.describe());
  const auto fp8 = loom::plan_from_file(
      loom::model<models::TinyGpt>(small),
      written("quantized-fp8",
              R"({"plan": [{"quantized": {"format": "fp8", "scaling": "tensor"}}, {"lora": {"rank": 4}}]})"));
  CHECK_THAT(fp8.describe(), ContainsSubstring("quantized(format=fp8, scaling=tensor)"));
  CHECK_THROWS_WITH(
      loom::plan_from_file(
          loom::model<models::TinyGpt>(small),
          written("quantized-int4", R"({"plan": [{"quantized": {"format": "nf5"}}, {"lora": {"rank": 4}}]})")),
      ContainsSubstring("quantized.format: give one of \"nf4\", \"fp8\" (did you mean 'nf4'?)"));

  // As PEFT's QLoRA guide configures transformers, bnb_4bit_compute_dtype included.
  const auto bnb = loom::plan_from_file(
      loom::model<models::TinyGpt>(small),
      written("bnb", R"({"plan": [{"quantization_config": {"load_in_4bit": true, "bnb_4bit_quant_type": "nf4",
                 "bnb_4bit_use_double_quant": false, "bnb_4bit_compute_dtype": "bfloat16"}}, {"lora": {"rank": 4}}]})"));
  CHECK_THAT(bnb.describe(), ContainsSubstring("quantized(format=nf4, block_size=64, double_quant=false)"));
  const auto refused = [](const std::string& config) {
    return loom::plan_from_file(
        loom::model<models::TinyGpt>(small),
        written("bnb-refused", R"({"plan": [{"quantization_config": )" + config + R"(}, {"lora": {"rank": 4}}]})"));
  };
  CHECK_THROWS_WITH(refused(R"({"load_in_4bit": true, "bnb_4bit_quant_type": "fp4"})"),
                    ContainsSubstring("quantization_config.bnb_4bit_quant_type: give \"nf4\""));
  CHECK_THROWS_WITH(refused(R"({"load_in_8bit": true})"),
                    ContainsSubstring("quantization_config.load_in_8bit: LLM.int8() is not one of loom's formats"));
  CHECK_THROWS_WITH(refused(R"({"load_in_4bit": true, "llm_int8_threshold": 6.0})"),
                    ContainsSubstring("quantization_config.llm_int8_threshold: unknown key"));
}

TEST_CASE("an override that adds a stage puts it where the rules want it", "[run_file]") {
  const fs::path file = source / "tests" / "run_files" / "tiny_gpt_lora_fsdp.json";
  // Each alone, and all of them: every stage a run file can add, given after a file with a strategy.
  const std::vector<std::string> added{R"(mixed_precision={"param": "bf16"})",
                                       "recompute={}",
                                       "default_dtype=fp32",
                                       "pretrained=weights/",
                                       "seeded=3",
                                       R"(sequence_parallel={"size": 2})",
                                       R"(tensor_parallel={"size": 1})"};
  for (const std::string& override : added) {
    CAPTURE(override);
    CHECK_NOTHROW((void)loom::read_run_stages(file, std::vector<std::string>{override}));
  }
  const loom::run_stages all = loom::read_run_stages(file, added);
  std::vector<std::string> order;
  for (const loom::stage_kind kind : all.kinds) order.emplace_back(loom::name_of(kind));
  CHECK(order == std::vector<std::string>{"seeded", "default_dtype", "pretrained", "mixed_precision", "recompute",
                                          "sequence_parallel", "tensor_parallel", "lora", "trainable", "fsdp"});
  const auto typed = loom::model<models::TinyGpt>(small) | loom::seeded(7) |
                     loom::mixed_precision({.param = loom::bf16}) | loom::recompute() |
                     loom::lora(4, {"q_proj", "v_proj"}, {.alpha = 8}) | loom::trainable({"head"}) |
                     loom::fsdp({.reshard_after_forward = false});
  const std::vector<std::string> two{R"(mixed_precision={"param": "bf16"})", "recompute={}"};
  CHECK(loom::plan_from_file(loom::model<models::TinyGpt>(small), file, two).describe() == typed.describe());
}

TEST_CASE("overrides in dotted form apply on top of the file", "[run_file]") {
  const std::vector<std::string> overrides{"lora.rank=16", "strategy=ddp", "strategy.bucket_cap_mb=50", "seeded=9"};
  const auto plan = loom::plan_from_file(loom::model<models::TinyGpt>(small),
                                         source / "tests" / "run_files" / "tiny_gpt_lora_fsdp.json", overrides);
  const auto typed = loom::model<models::TinyGpt>(small) | loom::seeded(9) |
                     loom::lora(16, {"q_proj", "v_proj"}, {.alpha = 8}) | loom::trainable({"head"}) |
                     loom::ddp({.bucket_cap_mb = 50});
  CHECK(plan.describe() == typed.describe());
}

TEST_CASE("a run file's own mistakes name the file, the key and the accepted form", "[run_file][errors]") {
  const auto read = [](const std::string& name, const std::string& text, std::vector<std::string> overrides = {}) {
    (void)loom::read_run_stages(written(name, text), overrides);
  };
  CHECK_THROWS_WITH(read("key", R"({"plan": [{"lora": {"rank": 8, "rnak": 4}}]})"),
                    ContainsSubstring("lora.rnak: unknown key; lora takes rank, alpha, dropout, targets, patterns, "
                                      "exclude"));
  CHECK_THROWS_WITH(read("type", R"({"plan": [{"lora": {"rank": "8"}}]})"),
                    ContainsSubstring("lora.rank: give a whole number"));
  CHECK_THROWS_WITH(read("strategy", R"({"plan": [{"strategy": "zero3"}]})"),
                    ContainsSubstring("unknown strategy 'zero3'; the strategies are local, ddp, fsdp"));
  CHECK_THROWS_WITH(read("option", R"({"plan": [{"strategy": {"name": "fsdp", "bucket_cap": 5}}]})"),
                    ContainsSubstring("strategy.bucket_cap: unknown key; fsdp takes name, reshard_after_forward, "
                                      "bucket_cap_mb"));
  CHECK_THROWS_WITH(
      read("stage", R"({"plan": [{"dropout": 0.1}]})"),
      ContainsSubstring(
          "unknown stage 'dropout'; the stages after the model are seeded, default_dtype, "
          "pretrained, quantized, mixed_precision, recompute, sequence_parallel, tensor_parallel, lora, trainable, "
          "strategy"));
  CHECK_THROWS_WITH(read("top", R"({"plan": [], "steps": 3})"), ContainsSubstring("steps: unknown key"));
  CHECK_THROWS_WITH(read("json", "{\"plan\": [\n  {\"seeded\": }\n]}"),
                    ContainsSubstring("it is not JSON") && ContainsSubstring("line 2"));
  CHECK_THROWS_WITH(read("override", R"({"plan": []})", {"lora.rank=8"}),
                    ContainsSubstring("lora.rank: the run file has no lora stage to set it in"));
  CHECK_THROWS_WITH(read("override-form", R"({"plan": []})", {"lora.rank"}),
                    ContainsSubstring("an override is KEY=VALUE"));
  // An override's mistake is the command line's, not the file's.
  CHECK_THROWS_WITH(read("override-key", R"({"plan": [{"lora": {"rank": 8}}]})", {"lora.rnak=4"}),
                    ContainsSubstring("the override lora.rnak=4 (over run file '") &&
                        ContainsSubstring("override-key.json'): lora.rnak: unknown key; lora takes rank"));
  CHECK_THROWS_AS(read("missing", "x"), loom::run_file_error);
  // Found by tests/fuzz: a number beyond every type was nlohmann's out_of_range, naming no file.
  CHECK_THROWS_WITH(read("overflow", R"({"plan": [{"seeded": 8888888333333333E3333000000333960700868093884}]})"),
                    ContainsSubstring("overflow.json': it is not JSON") && ContainsSubstring("number overflow"));
}

TEST_CASE("an unknown key, stage or override names the keys it is close to", "[run_file][errors]") {
  const auto read = [](const std::string& name, const std::string& text, std::vector<std::string> overrides = {}) {
    (void)loom::read_run_file(written(name, text), overrides);
  };
  // Within a stage, a strategy, train, train.lr and flow_matching: the keys of that object.
  CHECK_THROWS_WITH(read("near-key", R"({"plan": [{"lora": {"rank": 8, "rnak": 4}}]})"),
                    ContainsSubstring("lora.rnak: unknown key; lora takes rank, alpha, dropout, targets, patterns, "
                                      "exclude, use_rslora, rank_pattern, alpha_pattern, modules_to_save (did you "
                                      "mean 'rank'?)"));
  CHECK_THROWS_WITH(read("near-option", R"({"plan": [{"strategy": {"name": "fsdp", "bucket_cap": 5}}]})"),
                    ContainsSubstring("strategy.bucket_cap: unknown key; fsdp takes") &&
                        ContainsSubstring("(did you mean 'bucket_cap_mb'?)"));
  CHECK_THROWS_WITH(read("near-strategy", R"({"plan": [{"strategy": "fsdpp"}]})"),
                    ContainsSubstring("unknown strategy 'fsdpp'; the strategies are local, ddp, fsdp (did you mean "
                                      "'fsdp'?)"));
  CHECK_THROWS_WITH(read("near-stage", R"({"plan": [{"lroa": {"rank": 8}}]})"),
                    ContainsSubstring("plan[0]: unknown stage 'lroa'; the stages after the model are seeded") &&
                        ContainsSubstring("trainable, strategy (did you mean 'lora'?)"));
  CHECK_THROWS_WITH(read("near-train", R"({"train": {"stpes": 3}})"),
                    ContainsSubstring("train.stpes: unknown key; train takes steps, accumulate") &&
                        ContainsSubstring("(did you mean 'steps'?)"));
  CHECK_THROWS_WITH(
      read("near-lr", R"({"train": {"steps": 3, "lr": {"peek": 0.1}}})"),
      ContainsSubstring("train.lr.peek: unknown key; lr takes peak") && ContainsSubstring("(did you mean 'peak'?)"));
  CHECK_THROWS_WITH(read("near-flow", R"({"flow_matching": {"weighting_schem": "uniform"}})"),
                    ContainsSubstring("flow_matching.weighting_schem: unknown key; flow_matching takes") &&
                        ContainsSubstring("(did you mean 'weighting_scheme'?)"));
  // At the top, and in an override: every key of a run file, dotted; one without its section
  // (what `--steps 100` or `--out DIR` to a recipe becomes) is offered that key.
  CHECK_THROWS_WITH(read("top-steps", R"({"plan": [], "steps": 3})"),
                    ContainsSubstring("steps: unknown key; a run file has \"plan\", \"train\"") &&
                        ContainsSubstring("(did you mean 'train.steps'?)"));
  CHECK_THROWS_WITH(
      read("override-steps", R"({"train": {"steps": 3}})", {"steps=100"}),
      ContainsSubstring("the override steps=100 (over run file '") &&
          ContainsSubstring("override-steps.json'): steps: unknown key; an override names a stage, a "
                            "stage's key or a key of train, flow_matching, ema, sampling, data, optimizer or chat, as "
                            "docs/run_files.md lists them (did you mean 'train.steps'?)"));
  CHECK_THROWS_WITH(read("override-out", R"({"train": {"steps": 3}})", {"out=/tmp/run"}),
                    ContainsSubstring("the override out=/tmp/run (over run file '") &&
                        ContainsSubstring("(did you mean 'train.out'?)"));
  CHECK_THROWS_WITH(read("override-stage", R"({"plan": [{"lora": {"rank": 8}}]})", {"lroa.rank=4"}),
                    ContainsSubstring("lroa.rank: unknown key") && ContainsSubstring("(did you mean 'lora.rank'?)"));
  CHECK_THROWS_WITH(read("override-lr", R"({"train": {"steps": 3}})", {"train.lr.peek=0.1"}),
                    ContainsSubstring("the override train.lr.peek=0.1 (over run file '") &&
                        ContainsSubstring("(did you mean 'peak'?)"));
  // FastVideo's layout, in its own spelling.
  CHECK_THROWS_WITH(
      (void)loom::read_run_file(written("near-fastvideo", "training:\n  steps: 3\n  stesp: 4\n", ".yaml")),
      ContainsSubstring("training.stesp: unknown key") && ContainsSubstring("(did you mean 'steps'?)"));
  // Nothing close, nothing offered.
  CHECK_THROWS_WITH(read("override-far", R"({"train": {"steps": 3}})", {"bogus=1"}),
                    ContainsSubstring("bogus: unknown key") && !ContainsSubstring("did you mean"));
}

TEST_CASE("a TOML run file reads as its JSON twin, and its mistakes name their line", "[run_file][toml]") {
  const auto from_toml = loom::plan_from_file(loom::model<models::TinyGpt>(small),
                                              source / "tests" / "run_files" / "tiny_gpt_lora_fsdp.toml");
  const auto from_json = loom::plan_from_file(loom::model<models::TinyGpt>(small),
                                              source / "tests" / "run_files" / "tiny_gpt_lora_fsdp.json");
  CHECK(from_toml.describe() == from_json.describe());
  const loom::train_options options =
      loom::read_train_options(source / "tests" / "run_files" / "tiny_gpt_lora_fsdp.toml");
  CHECK(options.steps == 300);
  CHECK(options.out == "runs/adapt");
  CHECK(options.lr->peak == 5e-3);

  const auto read = [](const std::string& name, const std::string& text, std::vector<std::string> overrides = {}) {
    (void)loom::read_run_stages(written(name, text, ".toml"), overrides);
  };
  const std::string lora_on_line_3 = "plan = [\n  { seeded = 1 },\n  { lora = { rank = 8, rnak = 4 } },\n]\n";
  CHECK_THROWS_WITH(read("key", lora_on_line_3), ContainsSubstring(", line 3: lora.rnak: unknown key; lora takes"));
  CHECK_THROWS_WITH(read("type", "[[plan]]\nseeded = 1\n[[plan]]\nlora = { rank = 8.5 }\n"),
                    ContainsSubstring(", line 4: lora.rank: give a whole number"));
  CHECK_THROWS_WITH(read("stage", "plan = [\n  { seeded = 1 },\n  { dropout = 0.1 },\n]\n"),
                    ContainsSubstring(", line 3: plan[1]: unknown stage 'dropout'"));
  CHECK_THROWS_WITH(read("syntax", "plan = [\n  { seeded = },\n]\n"), ContainsSubstring("line 2: it is not TOML"));
  // loom reads TOML in ASCII outside comment lines: toml++ 3.3 misbehaves on anything else (tests/fuzz).
  CHECK_THROWS_WITH(read("non-ascii", "plan = [\n  { caf\u00e9 = 1 },\n]\n"),
                    ContainsSubstring("line 2: a character outside ASCII; loom reads TOML run files in ASCII"));
  CHECK_THROWS_WITH(read("non-ascii-string", "# caf\u00e9\nplan = [{ trainable = [\"caf\u00e9\"] }]\n"),
                    ContainsSubstring("line 2: a character outside ASCII") && ContainsSubstring("\\uXXXX"));
  const auto spelled = loom::read_run_stages(written("escaped", "  # caf\u00e9\nplan = [{ seeded = 1 }]\n", ".toml"));
  CHECK(spelled.stages.find<loom::seeded_stage>().has_value());
  CHECK_THROWS_WITH(read("unclosed", "plan = [\n  { seeded = \"1 },\n]\n"),
                    ContainsSubstring("line 2: it is not TOML (Error while parsing"));
  CHECK_THROWS_WITH(read("date", "plan = [{ seeded = 1979-05-27 }]\n"),
                    ContainsSubstring("seeded: give the seed as a whole number"));
  // A key set on the command line is not the file's: no line.
  CHECK_THROWS_WITH(read("override", "plan = [\n  { lora = { rank = 8 } },\n]\n", {"lora.rank=x"}),
                    ContainsSubstring("the override lora.rank=x (over run file '") &&
                        ContainsSubstring("override.toml'): lora.rank: give a whole number"));
  CHECK_THROWS_WITH(loom::read_run_stages(written("extension", "{}", ".ini")),
                    ContainsSubstring("give a run file named *.toml, *.yaml or *.json"));
  CHECK_THROWS_WITH(loom::read_train_options(written("train-key", "[train]\nsteps = 10\nstesp = 3\n", ".toml")),
                    ContainsSubstring(", line 3: train.stesp: unknown key; train takes steps"));
}

TEST_CASE("a YAML run file reads as its JSON twin, in loom's layout and in FastVideo's", "[run_file][yaml]") {
  const auto plan_of = [](const fs::path& file) {
    return loom::plan_from_file(loom::model<models::TinyGpt>(small), loom::read_run_file(file));
  };
  const fs::path files = source / "tests" / "run_files";
  const std::string expected = plan_of(files / "tiny_gpt_lora_fsdp.json").describe();
  for (const char* name : {"tiny_gpt_lora_fsdp.yaml", "tiny_gpt_lora_fsdp_fastvideo.yaml"}) {
    CAPTURE(name);
    CHECK(plan_of(files / name).describe() == expected);
    const loom::run_file file = loom::read_run_file(files / name);
    CHECK(file.train.steps == 300);
    CHECK(file.train.out == "runs/adapt");
    CHECK(file.train.lr->peak == 5e-3);
    CHECK(file.train.lr->warmup_steps == 30);
    CHECK(file.notes.empty());
  }
  // Overrides reach the translated stages as they reach written ones.
  const auto overridden =
      loom::read_run_stages(files / "tiny_gpt_lora_fsdp_fastvideo.yaml", std::vector<std::string>{"lora.rank=16"});
  CHECK(overridden.stages.find<loom::lora_stage>()->rank() == 16);
}

TEST_CASE("a YAML run file's overrides in FastVideo's spelling are set where the file writes them",
          "[run_file][yaml]") {
  const fs::path file = written("fastvideo-overrides",
                                "models:\n  transformer:\n    lora: {enable: true, rank: 8}\n"
                                "training:\n  distributed:\n    strategy: fsdp\n    sp_size: 1\n  steps: 5\n",
                                ".yaml");
  const loom::run_file overridden = loom::read_run_file(
      file, std::vector<std::string>{"models.transformer.lora.rank=32", "training.steps=40", "train.log_every=4"});
  CHECK(overridden.stages.stages.find<loom::lora_stage>()->rank() == 32);
  CHECK(overridden.train.steps == 40);
  CHECK(overridden.train.log_every == 4);
  // Checked as the file's own keys are, and named as given.
  CHECK(loom::read_run_file(file, std::vector<std::string>{"training.distributed.sp_size=2"})
            .stages.stages.find<loom::sequence_parallel_stage>()
            ->settings()
            .size == 2);
  CHECK_THROWS_WITH(loom::read_run_file(file, std::vector<std::string>{"training.distributed.sp_size=0"}),
                    ContainsSubstring("the override training.distributed.sp_size=0 (over run file '") &&
                        ContainsSubstring("training.distributed.sp_size: give a whole number of GPUs, or -1"));
  CHECK_THROWS_WITH(loom::read_run_file(file, std::vector<std::string>{"training.stepz=3"}),
                    ContainsSubstring("the override training.stepz=3 (over run file '") &&
                        ContainsSubstring("training.stepz: unknown key"));
  CHECK_THROWS_WITH(loom::read_run_file(file, std::vector<std::string>{"models.transformer.lora.rank=0"}),
                    ContainsSubstring("line 3: models.transformer.lora (with the override "
                                      "models.transformer.lora.rank=0): loom R5"));
  // A file in loom's layout names loom's spelling.
  const fs::path toml = written("loom-layout", "[train]\nsteps = 5\n", ".toml");
  CHECK_THROWS_WITH(loom::read_run_file(toml, std::vector<std::string>{"training.steps=40"}),
                    ContainsSubstring("training is FastVideo's spelling, which YAML run files take; this run file is "
                                      "in loom's: override loom's key (train.steps for training.steps"));
}

TEST_CASE("PEFT's LoRA options in loom's lora stage: use_rslora, all-linear, rank_pattern, alpha_pattern",
          "[run_file]") {
  const loom::run_file file = loom::read_run_file(
      written("peft-options", R"({"plan": [{"lora": {"rank": 8, "targets": "all-linear", "use_rslora": true,
        "rank_pattern": {"v_proj": 2, "layers\\.0\\..*": 4}, "alpha_pattern": {"q_proj": 3}}}]})"));
  const loom::lora_stage lora = *file.stages.stages.find<loom::lora_stage>();
  CHECK(lora.targets() == loom::target_list{loom::all_linear});
  CHECK(lora.use_rslora());
  // In the file's order, not sorted: the first key that matches a layer gives its value.
  CHECK(lora.describe() ==
        "lora(rank=8, alpha=8, dropout=0, targets=[all-linear], exclude=[], use_rslora=true, "
        "rank_pattern={v_proj: 2, layers\\.0\\..*: 4}, alpha_pattern={q_proj: 3})");
  const auto typed = loom::lora(
      8, {loom::all_linear},
      {.use_rslora = true, .rank_pattern = {{"v_proj", 2}, {R"(layers\.0\..*)", 4}}, .alpha_pattern = {{"q_proj", 3}}});
  CHECK(lora.describe() == typed.describe());
  CHECK_THROWS_WITH(loom::read_run_file(written("pattern-type", R"({"plan": [{"lora": {"rank": 8,
                        "rank_pattern": ["v_proj"]}}]})")),
                    ContainsSubstring("lora.rank_pattern: give an object of a module name or regex to a number"));
  CHECK_THROWS_WITH(loom::read_run_file(written("pattern-value", R"({"plan": [{"lora": {"rank": 8,
                        "alpha_pattern": {"q_proj": "3"}}}]})")),
                    ContainsSubstring("lora.alpha_pattern.q_proj: give a number"));
}

TEST_CASE("FastVideo's LoRA block: enable, rank, alpha, target_modules, as its LoraConfig reads them",
          "[run_file][yaml]") {
  const auto read = [](const std::string& name, const std::string& text) {
    return loom::read_run_file(written(name, text, ".yaml"));
  };
  SECTION("alpha defaults to the rank; the strategy's name is normalised") {
    const loom::run_file file = read("alpha",
                                     "models:\n  transformer:\n    lora: {enable: true, rank: 8, "
                                     "target_modules: [q_proj]}\ntraining:\n  distributed:\n    strategy: DDP\n"
                                     "  steps: 5\n");
    CHECK(file.stages.stages.find<loom::lora_stage>()->rank() == 8);
    CHECK(file.stages.stages.find<loom::lora_stage>()->scaling() == 1.0);
    CHECK(std::holds_alternative<loom::ddp_stage>(file.stages.strategy.value()));
    CHECK(file.train.steps == 5);
  }
  SECTION("target_modules: all-linear, PEFT's spelling, in any case") {
    const loom::run_file file = read("all-linear",
                                     "models:\n  transformer:\n    lora: {enable: true, rank: 8, "
                                     "target_modules: All-Linear}\n");
    CHECK(file.stages.stages.find<loom::lora_stage>()->targets() == loom::target_list{loom::all_linear});
  }
  SECTION("enable: false with a rank is valid, applies no LoRA, and says so once") {
    const loom::run_file file = read("disabled", "models:\n  transformer:\n    lora: {enable: false, rank: 8}\n");
    CHECK_FALSE(file.stages.stages.find<loom::lora_stage>().has_value());
    REQUIRE(file.notes.size() == 1);
    CHECK_THAT(file.notes[0], ContainsSubstring("models.transformer.lora.enable is false: no LoRA is applied (its "
                                                "rank 8 is not used)"));
  }
  SECTION("the mistakes name their line, the key and the fix") {
    CHECK_THROWS_WITH(
        read("no-rank", "models:\n  transformer:\n    lora:\n      enable: true\n"),
        ContainsSubstring(", line 3: models.transformer.lora: rank is missing; enable: true needs the adapters' rank"));
    CHECK_THROWS_WITH(read("typo",
                           "models:\n  transformer:\n    lora:\n      enable: true\n      rank: 8\n"
                           "      target_module: [q_proj]\n"),
                      ContainsSubstring(", line 6: models.transformer.lora.target_module: unknown key; "
                                        "models.transformer.lora takes enable, rank, alpha, target_modules"));
    CHECK_THROWS_WITH(read("rank-type", "models:\n  transformer:\n    lora:\n      enable: true\n      rank: 8.5\n"),
                      ContainsSubstring(", line 5: models.transformer.lora.rank: give a whole number"));
    CHECK_THROWS_WITH(read("enable-type", "models:\n  transformer:\n    lora: {enable: yes, rank: 8}\n"),
                      ContainsSubstring("models.transformer.lora.enable: give true or false"));
    CHECK_THROWS_WITH(
        read("strategy", "training:\n  distributed:\n    strategy: zero3\n"),
        ContainsSubstring(", line 3: training.distributed.strategy: unknown strategy 'zero3'; the strategies are "
                          "local, ddp, fsdp"));
    // loom's train.* is FastVideo's training.*, in the file's spelling.
    CHECK_THROWS_WITH(read("training-key", "training:\n  step: 3\n"),
                      ContainsSubstring(", line 2: training.step: unknown key"));
    CHECK_THROWS_WITH(read("two-roles",
                           "models:\n  a:\n    lora: {enable: true, rank: 4}\n  b:\n"
                           "    lora: {enable: true, rank: 4}\n"),
                      ContainsSubstring("LoRA is enabled for models.a too; loom trains one model"));
    CHECK_THROWS_WITH(read("both", "train:\n  steps: 3\ntraining:\n  steps: 4\n"),
                      ContainsSubstring("training: the file has train too"));
    CHECK_THROWS_WITH(read("top", "dataset:\n  path: x\n"),
                      ContainsSubstring("dataset: unknown key; a run file has \"plan\", \"train\", \"flow_matching\", "
                                        "\"ema\", \"sampling\", \"data\", \"optimizer\" and \"chat\""));
    CHECK_THROWS_WITH(read("syntax", "plan:\n  - seeded: [1\n"), ContainsSubstring("it is not YAML"));
  }
  SECTION("a rule is broken with the compiler's sentence") {
    try {
      (void)read("rule", "models:\n  transformer:\n    lora: {enable: true, rank: 0}\n");
      FAIL("rank 0 was accepted");
    } catch (const loom::plan_error& error) {
      CHECK(std::regex_search(error.what(), std::regex(expected_of("r5_rank_zero"))));
      // With the file, the line and the key as written.
      CHECK_THAT(error.what(), ContainsSubstring("rule.yaml', line 3: models.transformer.lora: loom R5"));
    }
  }
}

TEST_CASE("FastVideo's training.distributed: hybrid sharding as fsdp's shard_group_size, the ranks it asks for",
          "[run_file][yaml]") {
  const auto read = [](const std::string& name, const std::string& distributed) {
    return loom::read_run_file(written(name, "training:\n  distributed:\n" + distributed + "  steps: 3\n", ".yaml"));
  };
  const auto shard_group_size = [](const loom::run_file& file) {
    return std::get<loom::fsdp_stage>(file.stages.strategy.value()).settings().shard_group_size;
  };
  SECTION("hsdp_replicate_dim × hsdp_shard_dim is fsdp in groups of hsdp_shard_dim, over their product's ranks") {
    const loom::run_file file =
        read("hybrid", "    num_gpus: 4\n    sp_size: 1\n    hsdp_replicate_dim: 2\n    hsdp_shard_dim: 2\n");
    CHECK(shard_group_size(file) == 2);
    REQUIRE(file.ranks.has_value());
    CHECK(file.ranks->ranks == 4);
    CHECK_NOTHROW(loom::check_world_size(file, 4));
    CHECK_THROWS_WITH(loom::check_world_size(file, 2),
                      ContainsSubstring("hybrid.yaml', line 2: training.distributed: hsdp_replicate_dim 2 × "
                                        "hsdp_shard_dim 2 asks for 4 ranks, but the job has 2: launch 4 ranks, or make "
                                        "hsdp_replicate_dim × hsdp_shard_dim 2"));
    // With the strategy named, in any case, and an option of its own.
    const loom::run_file named = read("named",
                                      "    strategy: {name: FSDP, reshard_after_forward: false}\n"
                                      "    hsdp_shard_dim: 2\n    sp_size: 1\n");
    CHECK(shard_group_size(named) == 2);
    CHECK_FALSE(std::get<loom::fsdp_stage>(named.stages.strategy.value()).settings().reshard_after_forward);
  }
  SECTION("num_gpus alone asks for its ranks; -1 shards across every rank; none leaves the world to the launch") {
    const loom::run_file gpus = read("gpus", "    strategy: ddp\n    num_gpus: 2\n    sp_size: 1\n");
    CHECK(std::holds_alternative<loom::ddp_stage>(gpus.stages.strategy.value()));
    CHECK_THROWS_WITH(loom::check_world_size(gpus, 3),
                      ContainsSubstring("training.distributed.num_gpus: num_gpus 2 asks for 2 ranks, but the job has "
                                        "3: launch 2 ranks, or make num_gpus 3"));
    CHECK(shard_group_size(read("every", "    hsdp_shard_dim: -1\n")) == 0);
    CHECK_NOTHROW(loom::check_world_size(read("plain", "    strategy: fsdp\n"), 7));
  }
  SECTION("sp_size is sequence_parallel, before the strategy; without it, num_gpus, as FastVideo reads it") {
    const auto split_size = [](const loom::run_file& file) {
      const auto stage = file.stages.stages.find<loom::sequence_parallel_stage>();
      return stage ? stage->settings().size : std::size_t{1};
    };
    const loom::run_file sp = read("sp", "    strategy: fsdp\n    sp_size: 2\n");
    CHECK(split_size(sp) == 2);
    std::vector<std::string> order;
    for (const loom::stage_kind kind : sp.stages.kinds) order.emplace_back(loom::name_of(kind));
    CHECK(order == std::vector<std::string>{"sequence_parallel", "fsdp"});
    CHECK_NOTHROW(loom::check_world_size(sp, 4));
    CHECK_THROWS_WITH(loom::check_world_size(sp, 3),
                      ContainsSubstring("sp.yaml', line 4: training.distributed.sp_size: sequence_parallel splits each "
                                        "sequence over 2 ranks, which does not divide the job's 3: launch a multiple "
                                        "of 2 ranks, or make training.distributed.sp_size a divisor of 3"));
    CHECK(split_size(read("sp-default", "    num_gpus: 4\n")) == 4);
    CHECK(split_size(read("sp-every", "    num_gpus: 2\n    sp_size: -1\n")) == 2);
    CHECK(split_size(read("sp-one", "    num_gpus: 2\n    sp_size: 1\n")) == 1);
    CHECK_THROWS_WITH(read("sp-odd", "    num_gpus: 4\n    sp_size: 3\n"),
                      ContainsSubstring("training.distributed.sp_size: is 3, which does not divide num_gpus 4"));
  }
  SECTION("tp_size is tensor_parallel, before the strategy; -1 and 1 split nothing; with it, no sp_size is 1") {
    const auto split_size = [](const loom::run_file& file) {
      const auto stage = file.stages.stages.find<loom::tensor_parallel_stage>();
      return stage ? stage->settings().size : std::size_t{1};
    };
    const loom::run_file tp = read("tp", "    strategy: fsdp\n    num_gpus: 4\n    tp_size: 2\n");
    CHECK(split_size(tp) == 2);
    CHECK_FALSE(tp.stages.stages.find<loom::sequence_parallel_stage>());
    std::vector<std::string> order;
    for (const loom::stage_kind kind : tp.stages.kinds) order.emplace_back(loom::name_of(kind));
    CHECK(order == std::vector<std::string>{"tensor_parallel", "fsdp"});
    const auto typed = loom::model<models::TinyGpt>(small) | loom::tensor_parallel(2) | loom::fsdp();
    CHECK(loom::plan_from_file(loom::model<models::TinyGpt>(small), tp).describe() == typed.describe());
    const loom::run_file odd_world = read("tp-world", "    strategy: fsdp\n    tp_size: 2\n");
    CHECK_NOTHROW(loom::check_world_size(odd_world, 4));
    CHECK_THROWS_WITH(loom::check_world_size(odd_world, 3),
                      ContainsSubstring("tp-world.yaml', line 4: training.distributed.tp_size: tensor_parallel splits "
                                        "each layer over 2 ranks, which does not divide the job's 3: launch a multiple "
                                        "of 2 ranks, or make training.distributed.tp_size a divisor of 3"));
    CHECK(split_size(read("tp-every", "    num_gpus: 2\n    sp_size: 1\n    tp_size: -1\n")) == 1);
    CHECK(split_size(read("tp-one", "    num_gpus: 2\n    sp_size: 1\n    tp_size: 1\n")) == 1);
    CHECK_THROWS_WITH(read("tp-odd", "    num_gpus: 4\n    tp_size: 3\n"),
                      ContainsSubstring("training.distributed.tp_size: is 3, which does not divide num_gpus 4"));
    // Both splits, as the file asks, are R22's sentence where the plan is made.
    const loom::run_file both = read("tp-and-sp", "    num_gpus: 4\n    sp_size: 2\n    tp_size: 2\n");
    CHECK_THROWS_WITH(loom::plan_from_file(loom::model<models::TinyGpt>(small), both),
                      ContainsSubstring("loom R22: tensor_parallel(...) and sequence_parallel(...) both split"));
  }
  SECTION("sizes that disagree, in one sentence naming the key") {
    CHECK_THROWS_WITH(read("product",
                           "    num_gpus: 8\n    sp_size: 1\n    hsdp_replicate_dim: 2\n"
                           "    hsdp_shard_dim: 2\n"),
                      ContainsSubstring("training.distributed: hsdp_replicate_dim 2 × hsdp_shard_dim 2 is 4 ranks, "
                                        "but num_gpus is 8"));
    CHECK_THROWS_WITH(read("replicas", "    hsdp_replicate_dim: 2\n"),
                      ContainsSubstring("training.distributed.hsdp_replicate_dim: is 2 without hsdp_shard_dim"));
    CHECK_THROWS_WITH(read("ddp", "    strategy: ddp\n    hsdp_shard_dim: 2\n"),
                      ContainsSubstring("training.distributed.strategy: is ddp, but hsdp_replicate_dim and "
                                        "hsdp_shard_dim shard the model, as fsdp does"));
    CHECK_THROWS_WITH(read("size-type", "    hsdp_shard_dim: 0\n"),
                      ContainsSubstring("training.distributed.hsdp_shard_dim: give a whole number of GPUs, or -1"));
    CHECK_THROWS_WITH(read("unknown", "    pin_memory: true\n"),
                      ContainsSubstring("training.distributed.pin_memory: unknown key; training.distributed takes "
                                        "strategy, num_gpus, hsdp_replicate_dim, hsdp_shard_dim, sp_size, tp_size"));
  }
}

TEST_CASE("chat data's options: the chat object in every layout, its overrides, and its refusals", "[run_file]") {
  CHECK_FALSE(loom::read_run_file(written("chat-none", R"({"plan": []})")).chat.has_value());
  const loom::run_file defaults = loom::read_run_file(written("chat-empty", R"({"chat": {}})"));
  REQUIRE(defaults.chat.has_value());
  const loom::data::chat_dataset_options dataset_defaults;
  CHECK(defaults.chat->pack == dataset_defaults.pack);
  CHECK(defaults.chat->packing == dataset_defaults.packing);
  CHECK(defaults.chat->pack_window == dataset_defaults.pack_window);
  CHECK(defaults.chat->loss == loom::data::loss_on::assistant);
  CHECK(defaults.chat->chat_template_path.empty());

  const loom::run_file yaml =
      loom::read_run_file(written("chat-yaml",
                                  "chat:\n  format: sharegpt\n  loss_on: every_token\n  packing_strategy: greedy\n"
                                  "  chat_template_path: /tmp/t.jinja\ntraining:\n  steps: 3\n",
                                  ".yaml"),
                          std::vector<std::string>{"chat.packing=false", "chat.pack_window=7"});
  REQUIRE(yaml.chat.has_value());
  CHECK(yaml.chat->format == loom::data::record_format::sharegpt);
  CHECK(yaml.chat->loss == loom::data::loss_on::every_token);
  CHECK(yaml.chat->packing == loom::data::packing_strategy::greedy);
  CHECK_FALSE(yaml.chat->pack);
  CHECK(yaml.chat->pack_window == 7);
  CHECK(yaml.chat->chat_template_path == "/tmp/t.jinja");
  CHECK(yaml.train.steps == 3);
  const loom::data::chat_dataset_options applied = yaml.chat->applied_to({.seq_len = 64});
  CHECK(applied.fields.messages == "conversations");
  CHECK(applied.seq_len == 64);
  CHECK_FALSE(applied.pack);

  const loom::run_file toml = loom::read_run_file(written("chat-toml", "[chat]\npacking = false\n", ".toml"));
  CHECK_FALSE(toml.chat->pack);

  CHECK_THROWS_WITH(loom::read_run_file(written("chat-format", "chat:\n  format: alpaca\n", ".yaml")),
                    ContainsSubstring(", line 2: chat.format: give one of \"openai\", \"sharegpt\""));
  CHECK_THROWS_WITH(
      loom::read_run_file(written("chat-key", R"({"chat": {"packing_strategy": "ffd", "pakcing": true}})")),
      ContainsSubstring("chat.pakcing: unknown key; chat takes") && ContainsSubstring("(did you mean 'packing'?)"));
  CHECK_THROWS_WITH(loom::read_run_file(written("chat-strategy", R"({"chat": {"packing_strategy": "ffd"}})")),
                    ContainsSubstring("chat.packing_strategy: give one of \"first_fit_decreasing\", \"greedy\""));
  CHECK_THROWS_WITH(
      loom::read_run_file(written("chat-window", R"({"chat": {}})"), std::vector<std::string>{"chat.pack_window=0"}),
      ContainsSubstring("chat.pack_window: is 0; give the number of records first-fit decreasing "
                        "packs together, at least 1 (1000 by default)"));
  CHECK_THROWS_WITH(loom::read_run_file(written("chat-object", R"({"chat": true})")),
                    ContainsSubstring("chat: give its options as an object"));
}

TEST_CASE("flow matching's options: loom's flow_matching, or FastVideo's training.model and the role's flow_shift",
          "[run_file][yaml]") {
  const loom::run_file fastvideo =
      loom::read_run_file(written("flow",
                                  "models:\n  transformer:\n    flow_shift: 5.0\ntraining:\n  model:\n"
                                  "    weighting_scheme: logit_normal\n    logit_mean: -0.5\n  steps: 3\n",
                                  ".yaml"),
                          std::vector<std::string>{"flow_matching.logit_std=2"});
  REQUIRE(fastvideo.flow_matching.has_value());
  CHECK(fastvideo.flow_matching->weighting_scheme == loom::timestep_density::logit_normal);
  CHECK(fastvideo.flow_matching->logit_mean == -0.5);
  CHECK(fastvideo.flow_matching->logit_std == 2.0);
  CHECK(fastvideo.flow_matching->flow_shift == 5.0);
  CHECK(fastvideo.train.steps == 3);

  const loom::run_file json = loom::read_run_file(written("flow-json", R"({"flow_matching": {"weighting_scheme": "mode",
    "mode_scale": 1.29, "num_train_timesteps": 500}})"));
  CHECK(json.flow_matching->weighting_scheme == loom::timestep_density::mode);
  CHECK(json.flow_matching->num_train_timesteps == 500);
  CHECK_FALSE(loom::read_run_file(written("flow-none", R"({"plan": []})")).flow_matching.has_value());

  CHECK_THROWS_WITH(
      loom::read_run_file(written("flow-scheme", "training:\n  model:\n    weighting_scheme: lognorm\n", ".yaml")),
      ContainsSubstring(", line 3: training.model.weighting_scheme: give \"uniform\", \"logit_normal\" "
                        "or \"mode\""));
  CHECK_THROWS_WITH(loom::read_run_file(written("flow-shift", "models:\n  transformer:\n    flow_shift: 0\n", ".yaml")),
                    ContainsSubstring(", line 3: models.transformer.flow_shift: is 0; give a positive shift"));
  CHECK(loom::read_run_file(written("flow-x0", "training:\n  model:\n    precondition_outputs: true\n", ".yaml"))
            .flow_matching->precondition_outputs);
  CHECK_THROWS_WITH(loom::read_run_file(written("flow-key", "training:\n  model:\n    precondition: true\n", ".yaml")),
                    ContainsSubstring("training.model.precondition: unknown key; training.model takes "
                                      "weighting_scheme, logit_mean, logit_std, mode_scale, precondition_outputs"));
  CHECK_THROWS_WITH(loom::read_run_file(written("flow-cfg", R"({"flow_matching": {"training_cfg_rate": 1.5}})")),
                    ContainsSubstring("flow_matching.training_cfg_rate: is 1.5; give a probability in [0, 1]"));
  const loom::run_file averaged = loom::read_run_file(written("ema", R"({"ema": {"decay": 0.99, "start_step": 10}})"),
                                                      std::vector<std::string>{"ema.decay=0.995"});
  REQUIRE(averaged.ema);
  CHECK(averaged.ema->decay == 0.995);
  CHECK(averaged.ema->start_step == 10);
  CHECK_FALSE(loom::read_run_file(written("ema-none", R"({"plan": []})")).ema.has_value());
  const loom::run_file sampled =
      loom::read_run_file(written("sampling", R"({"sampling": {"num_inference_steps": 20, "guidance_scale": 6}})"));
  REQUIRE(sampled.sampling);
  CHECK(sampled.sampling->num_inference_steps == 20);
  CHECK(sampled.sampling->guidance_scale == 6);
  CHECK(sampled.sampling->shift == 3);
  CHECK_THROWS_WITH(loom::read_run_file(written("sampling-steps", R"({"sampling": {"num_inference_steps": 0}})")),
                    ContainsSubstring("sampling.num_inference_steps: is 0; give the number of sampling steps"));
  CHECK_THROWS_WITH(loom::read_run_file(written("ema-decay", R"({"ema": {"decay": 1}})")),
                    ContainsSubstring("ema.decay: is 1; give a decay in [0, 1)"));
  CHECK_THROWS_WITH(loom::read_run_file(written("ema-key", R"({"ema": {"decay_rate": 0.9}})")),
                    ContainsSubstring("ema.decay_rate: unknown key"));
  CHECK_THROWS_WITH(loom::read_run_file(written("flow-override", R"({"plan": []})"),
                                        std::vector<std::string>{"flow_matching.shift=3"}),
                    ContainsSubstring("the override flow_matching.shift=3 (over run file"));
}

TEST_CASE("a job built from a run file has its strategy and its typed module", "[run_file]") {
  const auto plan = loom::plan_from_file(loom::model<models::TinyGpt>(small),
                                         source / "tests" / "run_files" / "tiny_gpt_lora_fsdp.json");
  auto built = loom::build(plan, loom::runtime::single_process());
  REQUIRE(built.index() == 2);  // fsdp
  std::visit(
      [&](auto& job) {
        models::TinyGpt& module = job.module();  // typed
        CHECK(module.blocks->size() == 2);
        CHECK(job.describe().starts_with(plan.describe()));
        CHECK(job.trainable_parameters().size() == 8 + 2);  // 4 adapted layers' A and B, and head
      },
      built);
}

TEST_CASE("the loop's options come from the file's train object, with train.* overrides", "[run_file]") {
  const fs::path file = written("train", R"({
    "plan": [{"strategy": "ddp"}],
    "train": {"steps": 300, "accumulate": 2, "clip_norm": 1.0, "out": "runs/adapt", "checkpoint_every": 50,
              "lr": {"peak": 0.005, "warmup_steps": 30, "decay_steps": 150, "decay": "cosine", "floor": 0.1}}})");
  const loom::train_options options =
      loom::read_train_options(file, std::vector<std::string>{"train.steps=200", "train.lr.peak=0.01"});
  CHECK(options.steps == 200);
  CHECK(options.accumulate == 2);
  CHECK(options.clip_norm == 1.0);
  CHECK(options.out == "runs/adapt");
  CHECK(options.checkpoint_every == 50);
  REQUIRE(options.lr.has_value());
  CHECK(options.lr->peak == 0.01);
  CHECK(options.lr->total_steps == 200);
  CHECK(options.lr->decay == loom::decay_shape::cosine);

  CHECK_THROWS_WITH(loom::read_train_options(written("stpes", R"({"train": {"stpes": 3}})")),
                    ContainsSubstring("train.stpes: unknown key; train takes steps, accumulate"));
  CHECK_THROWS_WITH(loom::read_train_options(written("decay", R"({"train": {"lr": {"decay": "exp"}}})")),
                    ContainsSubstring("train.lr.decay: give \"linear\" or \"cosine\""));
  CHECK_THROWS_WITH(loom::read_train_options(written("steps-type", R"({"train": {"steps": 2.5}})")),
                    ContainsSubstring("train.steps: give a whole number"));

  // The checkpoints' two switches: false unless set, in the file or by an override.
  CHECK_FALSE(options.async_checkpoints);
  CHECK_FALSE(options.strict_checkpoints);
  const loom::train_options switched =
      loom::read_train_options(written("switches", R"({"train": {"steps": 4, "async_checkpoints": true}})"),
                               std::vector<std::string>{"train.strict_checkpoints=true"});
  CHECK(switched.async_checkpoints);
  CHECK(switched.strict_checkpoints);
  CHECK_THROWS_WITH(
      loom::read_train_options(written("async-type", R"({"train": {"steps": 4, "async_checkpoints": 1}})")),
      ContainsSubstring("train.async_checkpoints: give true or false"));
}

TEST_CASE("an optional option takes none, or the file's null, for no value", "[run_file]") {
  const fs::path file = written("clipped", R"({"train": {"steps": 10, "clip_norm": 1.0, "lr": {"peak": 0.01}}})");
  CHECK(loom::read_train_options(file).clip_norm == 1.0);
  // What the refusal of train.clip_norm=-1 offers, an override takes.
  CHECK_FALSE(loom::read_train_options(file, std::vector<std::string>{"train.clip_norm=none"}).clip_norm.has_value());
  CHECK_FALSE(loom::read_train_options(file, std::vector<std::string>{"train.clip_norm=null"}).clip_norm.has_value());
  CHECK_FALSE(loom::read_train_options(file, std::vector<std::string>{"train.lr=none"}).lr.has_value());
  CHECK_FALSE(loom::read_train_options(written("null", R"({"train": {"steps": 10, "clip_norm": null}})"))
                  .clip_norm.has_value());
  CHECK_FALSE(loom::read_train_options(written("tilde", "train:\n  steps: 10\n  clip_norm: ~\n", ".yaml"))
                  .clip_norm.has_value());
  CHECK_THROWS_WITH(loom::read_train_options(file, std::vector<std::string>{"train.clip_norm=off"}),
                    ContainsSubstring("the override train.clip_norm=off (over run file '") &&
                        ContainsSubstring("train.clip_norm: give a number, or none"));
  // A key that must have a value says so without offering none.
  CHECK_THROWS_WITH(loom::read_train_options(file, std::vector<std::string>{"train.accumulate=none"}),
                    ContainsSubstring("train.accumulate: give a whole number") && !ContainsSubstring("or none"));
}

TEST_CASE("the values train() refuses are refused when the run file is read", "[run_file][errors]") {
  const fs::path zero = written("zero-steps", "[train]\nout = \"x\"\nsteps = 0\n", ".toml");
  CHECK_THROWS_AS(loom::read_train_options(zero), loom::run_file_error);
  CHECK_THROWS_WITH(loom::read_train_options(zero), ContainsSubstring(", line 3: train.steps: is 0; give at least 1"));
  CHECK_THROWS_WITH(loom::read_train_options(written("no-steps", R"({"train": {"out": "x"}})")),
                    ContainsSubstring("train.steps: missing; give the number of optimizer steps"));
  const fs::path file = written("fine", R"({"train": {"steps": 10, "lr": {"peak": 0.01, "warmup_steps": 4}}})");
  CHECK_THROWS_WITH(loom::read_train_options(file, std::vector<std::string>{"train.accumulate=0"}),
                    ContainsSubstring("train.accumulate: is 0; give at least 1 micro-batch a step"));
  CHECK_THROWS_WITH(loom::read_train_options(file, std::vector<std::string>{"train.clip_norm=-1"}),
                    ContainsSubstring("train.clip_norm: is -1; give a positive norm, or none"));
  CHECK_THROWS_WITH(loom::read_train_options(file, std::vector<std::string>{"train.steps=3"}),
                    ContainsSubstring("train.lr: warmup_steps (4) and decay_steps (0) add up to more than "
                                      "train.steps (3); give lengths that fit, e.g. --train.lr.warmup_steps=3 "
                                      "--train.lr.decay_steps=0 (the same proportions)"));
  // The shipped tiny-gpt-adapt-ddp.toml with the steps the help suggests: the overrides that fit.
  const fs::path shipped =
      written("shipped", R"({"train": {"steps": 300, "lr": {"peak": 0.005, "warmup_steps": 30, "decay_steps": 150}}})");
  CHECK_THROWS_WITH(loom::read_train_options(shipped, std::vector<std::string>{"train.steps=100"}),
                    ContainsSubstring("--train.lr.warmup_steps=16 --train.lr.decay_steps=83"));
  CHECK(loom::read_train_options(
            shipped, std::vector<std::string>{"train.steps=100", "train.lr.warmup_steps=16", "train.lr.decay_steps=83"})
            .lr->total_steps == 100);
  CHECK_THROWS_WITH(loom::read_train_options(file, std::vector<std::string>{"train.lr.peak=0"}),
                    ContainsSubstring("train.lr.peak: is 0; give a positive learning rate"));
  CHECK(loom::read_train_options(file).steps == 10);
  // A file of stages alone leaves the loop's options to the program.
  const loom::run_file stages_only = loom::read_run_file(written("stages-only", R"({"plan": [{"seeded": 3}]})"));
  CHECK(stages_only.stages.stages.find<loom::seeded_stage>().has_value());
  CHECK(stages_only.train.steps == 0);
}

TEST_CASE("default_dtype and mixed_precision are read from run files, with overrides", "[run_file]") {
  const fs::path file = written("precision", R"({"plan": [{"seeded": 1}, {"default_dtype": "bfloat16"},
      {"mixed_precision": {"param": "bf16", "output": "fp32"}}, {"strategy": "fsdp"}]})");
  const std::vector<std::string> overrides{"mixed_precision.cast_forward_inputs=false"};
  const loom::run_stages stages = loom::read_run_stages(file, overrides);
  CHECK(stages.stages.find<loom::default_dtype_stage>()->type() == loom::bf16);
  CHECK(stages.stages.find<loom::mixed_precision_stage>()->settings().param == loom::bf16);
  CHECK(stages.stages.find<loom::mixed_precision_stage>()->settings().output == loom::fp32);
  CHECK(!stages.stages.find<loom::mixed_precision_stage>()->settings().cast_forward_inputs);
  const auto typed = loom::model<models::TinyGpt>(small) | loom::seeded(1) | loom::default_dtype(loom::bf16) |
                     loom::mixed_precision({.output = loom::fp32, .cast_forward_inputs = false}) | loom::fsdp();
  CHECK(loom::plan_from_file(loom::model<models::TinyGpt>(small), file, overrides).describe() == typed.describe());

  const fs::path toml = written("precision", "plan = [{ mixed_precision = { param = \"bf16\" } }]\n", ".toml");
  CHECK(loom::read_run_stages(toml).stages.find<loom::mixed_precision_stage>()->settings().reduce == loom::fp32);

  CHECK_THROWS_WITH(loom::read_run_stages(written("bad-dtype", R"({"plan": [{"mixed_precision": {"param": "bf8"}}]})")),
                    ContainsSubstring("mixed_precision.param: give a dtype as a string, one of fp32, bf16, fp16"));
  CHECK_THROWS_WITH(
      loom::read_run_stages(written("bad-key", R"({"plan": [{"mixed_precision": {"compute": "bf16"}}]})")),
      ContainsSubstring("mixed_precision.compute: unknown key; mixed_precision takes param, reduce, "
                        "output, cast_forward_inputs"));
  CHECK_THROWS_WITH(loom::read_run_stages(written("bad-type", R"({"plan": [{"default_dtype": 16}]})")),
                    ContainsSubstring("default_dtype: give a dtype as a string"));
  // A rule broken in a run file is said with the file, and its advice as a run file writes it.
  try {
    (void)loom::read_run_stages(
        written("wide", "plan = [\n  { mixed_precision = { param = \"fp32\" } },\n]\n", ".toml"));
    FAIL("param fp32 was accepted");
  } catch (const loom::plan_error& error) {
    CHECK(error.rule() == 16);
    CHECK_THAT(error.what(), ContainsSubstring("wide.toml', line 2: mixed_precision: loom R16: mixed_precision param "
                                               "is fp32 or wider") &&
                                 ContainsSubstring("pass param = \"bf16\""));
    CHECK_THAT(error.what(), !ContainsSubstring(".param = loom::bf16"));
  }
}

TEST_CASE("recompute is read from run files, with overrides", "[run_file]") {
  const fs::path file = written("recompute", R"({"plan": [{"seeded": 1}, {"recompute": {"every": 3}},
      {"strategy": "fsdp"}]})");
  const std::vector<std::string> overrides{"recompute.every=2"};
  CHECK(loom::read_run_stages(file).stages.find<loom::recompute_stage>()->settings().every == 3);
  const auto typed =
      loom::model<models::TinyGpt>(small) | loom::seeded(1) | loom::recompute({.every = 2}) | loom::fsdp();
  CHECK(loom::plan_from_file(loom::model<models::TinyGpt>(small), file, overrides).describe() == typed.describe());

  const fs::path toml = written("recompute", "plan = [{ recompute = {} }]\n", ".toml");
  CHECK(loom::read_run_stages(toml).stages.find<loom::recompute_stage>()->settings().every == 1);

  CHECK_THROWS_WITH(
      loom::read_run_stages(written("recompute-bool", R"({"plan": [{"recompute": true}]})")),
      ContainsSubstring("recompute: give {\"every\": 1} to recompute every unit, or k for every k-th one"));
  CHECK_THROWS_WITH(loom::read_run_stages(written("recompute-key", R"({"plan": [{"recompute": {"mode": "full"}}]})")),
                    ContainsSubstring("recompute.mode: unknown key; recompute takes every"));
}

TEST_CASE("sequence_parallel is read from run files, checked by R20 and against the job's ranks", "[run_file]") {
  const fs::path file = written("sequence-parallel", R"({"plan": [{"seeded": 1}, {"sequence_parallel": {"size": 2}},
      {"strategy": "ddp"}]})");
  const auto typed = loom::model<models::TinyGpt>(small) | loom::seeded(1) | loom::sequence_parallel(4) | loom::ddp();
  CHECK(loom::plan_from_file(loom::model<models::TinyGpt>(small), file,
                             std::vector<std::string>{"sequence_parallel.size=4"})
            .describe() == typed.describe());
  const fs::path toml =
      written("sequence-parallel", "plan = [\n  { sequence_parallel = { size = 3 } },\n  { strategy = \"fsdp\" },\n]\n",
              ".toml");
  const loom::run_file read = loom::read_run_file(toml);
  CHECK(read.stages.stages.find<loom::sequence_parallel_stage>()->settings().size == 3);
  CHECK_NOTHROW(loom::check_world_size(read, 6));
  CHECK_THROWS_WITH(loom::check_world_size(read, 4),
                    ContainsSubstring("sequence-parallel.toml', line 2: sequence_parallel.size: sequence_parallel "
                                      "splits each sequence over 3 ranks, which does not divide the job's 4"));
  CHECK_THROWS_WITH(
      loom::read_run_stages(written("sequence-parallel-zero", R"({"plan": [{"sequence_parallel": {"size": 0}}]})")),
      ContainsSubstring("loom R20: sequence_parallel size is 0"));
  CHECK_THROWS_WITH(loom::read_run_stages(written("sequence-parallel-int", R"({"plan": [{"sequence_parallel": 2}]})")),
                    ContainsSubstring("sequence_parallel: give {\"size\": 2} to split each sequence across 2 ranks"));
}

TEST_CASE("tensor_parallel is read from run files, checked by R22 and against the job's ranks", "[run_file]") {
  const fs::path file = written("tensor-parallel", R"({"plan": [{"seeded": 1}, {"tensor_parallel": {"size": 2}},
      {"strategy": "ddp"}]})");
  const auto typed = loom::model<models::TinyGpt>(small) | loom::seeded(1) | loom::tensor_parallel(4) | loom::ddp();
  CHECK(loom::plan_from_file(loom::model<models::TinyGpt>(small), file,
                             std::vector<std::string>{"tensor_parallel.size=4"})
            .describe() == typed.describe());
  const fs::path toml = written(
      "tensor-parallel", "plan = [\n  { tensor_parallel = { size = 3 } },\n  { strategy = \"fsdp\" },\n]\n", ".toml");
  const loom::run_file read = loom::read_run_file(toml);
  CHECK(read.stages.stages.find<loom::tensor_parallel_stage>()->settings().size == 3);
  CHECK_NOTHROW(loom::check_world_size(read, 6));
  CHECK_THROWS_WITH(loom::check_world_size(read, 4),
                    ContainsSubstring("tensor-parallel.toml', line 2: tensor_parallel.size: tensor_parallel splits "
                                      "each layer over 3 ranks, which does not divide the job's 4"));
  const fs::path yaml =
      written("tensor-parallel", "plan:\n  - tensor_parallel: {size: 2}\n  - strategy: fsdp\n", ".yaml");
  CHECK(loom::plan_from_file(loom::model<models::TinyGpt>(small), yaml).describe() ==
        (loom::model<models::TinyGpt>(small) | loom::tensor_parallel(2) | loom::fsdp()).describe());
  // A group of one splits nothing: no size for the job's ranks to divide.
  CHECK_FALSE(loom::read_run_file(written("tensor-parallel-one", R"({"plan": [{"tensor_parallel": {"size": 1}}]})"))
                  .tensor_group);
  CHECK_THROWS_WITH(
      loom::read_run_stages(written("tensor-parallel-zero", R"({"plan": [{"tensor_parallel": {"size": 0}}]})")),
      ContainsSubstring("loom R22: tensor_parallel size is 0"));
  CHECK_THROWS_WITH(loom::read_run_stages(written("tensor-parallel-int", R"({"plan": [{"tensor_parallel": 2}]})")),
                    ContainsSubstring("tensor_parallel: give {\"size\": 2} to split each layer across 2 ranks"));
  CHECK_THROWS_WITH(
      loom::read_run_stages(written("tensor-parallel-key", R"({"plan": [{"tensor_parallel": {"degree": 2}}]})")),
      ContainsSubstring("tensor_parallel.degree: unknown key; tensor_parallel takes size"));
  // sequence_parallel(1) splits nothing, so it goes with tensor_parallel.
  CHECK_NOTHROW(loom::plan_from_file(
      loom::model<models::TinyGpt>(small),
      written("tensor-parallel-sequence-one",
              R"({"plan": [{"sequence_parallel": {"size": 1}}, {"tensor_parallel": {"size": 2}}]})")));
}

TEST_CASE("pretrained is read from run files; an empty path is R19's sentence", "[run_file]") {
  const fs::path file = written("pretrained", R"({"plan": [{"seeded": 1}, {"pretrained": "llama/"},
      {"lora": {"rank": 4}}, {"strategy": "fsdp"}]})");
  const loom::run_stages stages = loom::read_run_stages(file);
  REQUIRE(stages.stages.find<loom::pretrained_stage>());
  CHECK(stages.stages.find<loom::pretrained_stage>()->path() == "llama/");
  const auto typed =
      loom::model<models::TinyGpt>(small) | loom::seeded(1) | loom::pretrained("llama/") | loom::lora(4) | loom::fsdp();
  CHECK(loom::plan_from_file(loom::model<models::TinyGpt>(small), file).describe() == typed.describe());
  CHECK_THROWS_WITH(loom::read_run_stages(written("pretrained-empty", R"({"plan": [{"pretrained": ""}]})")),
                    ContainsSubstring("loom R19: pretrained path is empty"));
  CHECK_THROWS_WITH(loom::read_run_stages(written("pretrained-number", R"({"plan": [{"pretrained": 7}]})")),
                    ContainsSubstring("pretrained: give the checkpoint's folder or .safetensors file as a string"));
}

TEST_CASE("the shipped run files take any number of steps: their schedules are fractions of the run", "[run_file]") {
  const fs::path configs = source / "dsl_examples" / "configs";
  for (const char* name : {"lm_finetune.toml", "lm_finetune.yaml", "wan_finetune.yaml", "finetune.toml",
                           "tiny-gpt-adapt-ddp.toml", "tiny-gpt-adapt-fsdp.toml", "tiny-gpt-adapt-bf16-fsdp.toml"}) {
    for (const std::int64_t steps : {1, 3, 7, 1000}) {
      INFO(name << " with --train.steps=" << steps);
      const loom::run_file file = loom::read_run_file(configs / name, {{"train.steps=" + std::to_string(steps)}});
      REQUIRE(file.train.lr.has_value());
      CHECK(file.train.lr->total_steps == steps);
      CHECK(file.train.lr->warmup_length() + file.train.lr->decay_length() <= steps);
      CHECK_NOTHROW(file.train.lr->at(steps));
    }
  }
  // Absolute lengths that outgrow a shortened run name the fractions that would have scaled.
  const fs::path absolute = written(
      "absolute-lengths", R"({"train": {"steps": 60, "lr": {"peak": 0.003, "warmup_steps": 6, "decay_steps": 54}}})");
  CHECK_THROWS_WITH(loom::read_train_options(absolute, std::vector<std::string>{"train.steps=5"}),
                    ContainsSubstring("or write them in the run file as fractions of train.steps, which scale with "
                                      "it (train.lr.warmup_ratio, train.lr.decay_ratio)"));
  // A length on the command line replaces the file's, in either spelling.
  const loom::train_options fractions = loom::read_train_options(
      absolute, std::vector<std::string>{"train.lr.warmup_ratio=0.1", "train.lr.decay_ratio=0.9", "train.steps=5"});
  CHECK(fractions.lr->warmup_steps == 0);
  CHECK(fractions.lr->decay_length() == 4);
  const loom::train_options steps = loom::read_train_options(source / "dsl_examples" / "configs" / "lm_finetune.toml",
                                                             std::vector<std::string>{"train.lr.warmup_steps=1"});
  CHECK(!steps.lr->warmup_ratio);
  CHECK(steps.lr->warmup_length() == 1);
  CHECK(steps.lr->decay_ratio == 0.9);
}

// The job's files, on a single process: base weights in Hugging Face's layout (one file or a sharded
// set with its index) and PEFT adapters, with every refusal a user can meet.
#include <loom/io/peft.hpp>
#include <loom/loom.hpp>
#include "single_process.hpp"

#include <models/tiny_gpt.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_exception.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

using Catch::Matchers::ContainsSubstring;

namespace {

namespace fs = std::filesystem;

constexpr models::tiny_gpt_config small = loom::testing::small_gpt;
using loom::testing::one;

fs::path scratch(const std::string& name) { return loom::testing::scratch("loom-test-job-files", name); }

void randomise_adapters(torch::nn::Module& module, std::uint64_t seed) {
  torch::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (auto& p : module.named_parameters()) {
    if (p.key().ends_with("lora_B")) p.value().copy_(torch::randn(p.value().sizes(), gen) * 0.1);
  }
}

template <class Job>
bool same_state(Job& a, Job& b) {
  const auto x = a.state_dict(), y = b.state_dict();
  if (x.size() != y.size()) return false;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (x[i].name != y[i].name || !torch::equal(x[i].tensor, y[i].tensor)) return false;
  }
  return true;
}

constexpr auto adapted = loom::lora(4, {"q_proj", "v_proj"}, {.alpha = 6.5});

}  // namespace

TEST_CASE("weights round trip in one file and as a sharded set with its index", "[weights]") {
  auto source = loom::build(loom::model<models::TinyGpt>(small) | loom::seeded(1), one());
  auto target = loom::build(loom::model<models::TinyGpt>(small) | loom::seeded(2), one());
  REQUIRE_FALSE(same_state(source, target));

  const fs::path single = scratch("single");
  source.save_weights(single);
  CHECK(fs::exists(single / "model.safetensors"));
  (void)target.load_weights(single);
  CHECK(same_state(source, target));

  const fs::path sharded = scratch("sharded");
  source.save_weights(sharded, /*max_shard_bytes=*/8 * 1024);
  CHECK(fs::exists(sharded / "model.safetensors.index.json"));
  CHECK(fs::exists(sharded / "model-00002-of-00005.safetensors"));
  auto again = loom::build(loom::model<models::TinyGpt>(small) | loom::seeded(3), one());
  (void)again.load_weights(sharded / "model.safetensors.index.json");
  CHECK(same_state(source, again));
}

TEST_CASE("pretrained_checkpoint reads a slice along any dimension, whole or by rows, and only its bytes",
          "[weights]") {
  const fs::path folder = scratch("slices");
  const at::Tensor cube = torch::arange(4 * 6 * 10, torch::kFloat).reshape({4, 6, 10});
  const at::Tensor flat = torch::arange(12, torch::kDouble);
  loom::save_weights(folder, {{"cube", cube}, {"flat", flat}});
  loom::pretrained_checkpoint checkpoint(folder);
  for (const auto& [dim, first, count] : {std::tuple{0, 1, 2}, {1, 2, 3}, {2, 5, 5}, {2, 0, 1}}) {
    CAPTURE(dim, first, count);
    checkpoint.read_slices({{"cube", loom::tensor_slice{dim, first, count}}, {"flat", {0, 4, 8}}});
    const at::Tensor slice = cube.narrow(dim, first, count);
    const std::uint64_t before = checkpoint.bytes_read();
    CHECK(torch::equal(checkpoint.read("cube"), slice));
    CHECK(checkpoint.bytes_read() - before == slice.nbytes());
    const std::int64_t rows = slice.size(0);
    CHECK(torch::equal(checkpoint.read_rows("cube", 1, rows - 1), slice.narrow(0, 1, rows - 1)));
    CHECK(torch::equal(checkpoint.read_rows("flat", 2, 3), flat.narrow(0, 6, 3)));
    const std::vector<loom::tensor_spec> specs = checkpoint.specs();
    CHECK(specs.front().shape == slice.sizes().vec());
  }
  CHECK_THROWS_WITH(checkpoint.read_slices({{"cube", loom::tensor_slice{1, 4, 3}}}),
                    ContainsSubstring("'cube' of shape [4, 6, 10] has no elements [4, 7) along dimension 1"));
  CHECK_THROWS_WITH(checkpoint.read_slices({{"sphere", loom::tensor_slice{0, 0, 1}}}),
                    ContainsSubstring("no tensor 'sphere' to read a slice of"));
}

TEST_CASE("a folder of diffusers' weights is read under diffusers' names, one file or an index", "[weights]") {
  auto source = loom::build(loom::model<models::TinyGpt>(small) | loom::seeded(1), one());
  const fs::path single = scratch("diffusers-single");
  source.save_weights(single);
  fs::rename(single / "model.safetensors", single / "diffusion_pytorch_model.safetensors");
  auto target = loom::build(loom::model<models::TinyGpt>(small) | loom::seeded(2), one());
  (void)target.load_weights(single);
  CHECK(same_state(source, target));

  const fs::path sharded = scratch("diffusers-sharded");
  source.save_weights(sharded, /*max_shard_bytes=*/8 * 1024);
  fs::rename(sharded / "model.safetensors.index.json", sharded / "diffusion_pytorch_model.safetensors.index.json");
  auto again = loom::build(loom::model<models::TinyGpt>(small) | loom::seeded(3), one());
  (void)again.load_weights(sharded);
  CHECK(same_state(source, again));

  const fs::path empty = scratch("no-weights");
  fs::create_directories(empty);
  CHECK_THROWS_WITH(again.load_weights(empty),
                    ContainsSubstring("holds none of model.safetensors, model.safetensors.index.json, "
                                      "diffusion_pytorch_model.safetensors and "
                                      "diffusion_pytorch_model.safetensors.index.json"));
}

TEST_CASE("load_weights is strict by name, and says what it left alone when not", "[weights]") {
  auto source = loom::build(loom::model<models::TinyGpt>(small) | loom::seeded(1), one());
  const fs::path folder = scratch("partial");
  auto state = source.state_dict();
  std::erase_if(state, [](const loom::named_tensor& t) { return t.name.starts_with("head."); });
  state.push_back({"lm_head.weight", at::zeros({2})});
  loom::save_weights(folder, state);

  auto target = loom::build(loom::model<models::TinyGpt>(small) | loom::seeded(2), one());
  CHECK_THROWS_WITH(target.load_weights(folder),
                    ContainsSubstring("missing [head.weight, head.bias], unexpected [lm_head.weight]") &&
                        ContainsSubstring("strict = false"));
  const loom::weights_report report = target.load_weights(folder, /*strict=*/false);
  CHECK(report.missing == std::vector<std::string>{"head.weight", "head.bias"});
  CHECK(report.unexpected == std::vector<std::string>{"lm_head.weight"});
  CHECK(torch::equal(target.module().tok->weight, source.module().tok->weight));

  auto other = loom::build(
      loom::model<models::TinyGpt>(models::tiny_gpt_config{.vocab = 40, .d = 16, .layers = 2, .heads = 2, .ctx = 8}),
      one());
  CHECK_THROWS_WITH(other.load_weights(folder, false),
                    ContainsSubstring("'tok.weight' is Float[32,16] in the weights but Float[40,16] in the model"));
}

TEST_CASE("an adapter saved in PEFT's format loads back; the base weights leave the adapters out", "[peft]") {
  auto source = loom::build(loom::model<models::TinyGpt>(small) | loom::seeded(1) | adapted, one());
  randomise_adapters(source.module(), 7);
  const fs::path folder = scratch("adapter");
  source.save_adapter(folder / "adapter");
  source.save_weights(folder / "base");
  CHECK(fs::exists(folder / "adapter" / "adapter_config.json"));
  for (const auto& t : loom::load_weights(folder / "base")) CHECK_FALSE(t.name.ends_with("lora_A"));

  auto target = loom::build(loom::model<models::TinyGpt>(small) | loom::seeded(2) | adapted, one());
  (void)target.load_weights(folder / "base");
  target.load_adapter(folder / "adapter");
  CHECK(same_state(source, target));
}

TEST_CASE(
    "save_adapter refuses merged adapters, parameters a LoRA file cannot carry, and diffusers' file for a model of no "
    "pipeline",
    "[peft][errors]") {
  auto merged = loom::build(loom::model<models::TinyGpt>(small) | loom::seeded(1) | adapted, one());
  merged.merge();
  CHECK_THROWS_WITH(merged.save_adapter(scratch("merged")),
                    ContainsSubstring("apply it twice") && ContainsSubstring("job.unmerge() first"));
  auto extra =
      loom::build(loom::model<models::TinyGpt>(small) | loom::seeded(1) | adapted | loom::trainable({"head"}), one());
  CHECK_THROWS_WITH(extra.save_adapter(scratch("extra")),
                    ContainsSubstring("trainable(...) also trains 2 parameters (head.weight, head.bias)") &&
                        ContainsSubstring("{.modules_to_save = {...}}"));
  auto plain = loom::build(loom::model<models::TinyGpt>(small) | loom::seeded(1), one());
  CHECK_THROWS_WITH(plain.save_adapter(scratch("plain")), ContainsSubstring("needs a plan with lora(...)"));
  // diffusers' file keys the adapters under the model's name in its pipeline, which TinyGpt has not.
  auto no_pipeline = loom::build(loom::model<models::TinyGpt>(small) | loom::seeded(1) | adapted, one());
  CHECK_THROWS_WITH(no_pipeline.save_adapter(scratch("no-pipeline"), loom::adapter_format::diffusers),
                    ContainsSubstring("names no diffusers_component") &&
                        ContainsSubstring("use PEFT's folder (adapter_format::peft)"));
}

TEST_CASE("load_adapter checks rank, alpha and layers against the plan", "[peft][errors]") {
  auto source = loom::build(loom::model<models::TinyGpt>(small) | loom::seeded(1) | adapted, one());
  const fs::path folder = scratch("checked");
  source.save_adapter(folder);

  auto other_rank =
      loom::build(loom::model<models::TinyGpt>(small) | loom::lora(8, {"q_proj", "v_proj"}, {.alpha = 6.5}), one());
  CHECK_THROWS_WITH(other_rank.load_adapter(folder), ContainsSubstring("the adapter has rank r = 4, the plan lora(8"));
  auto other_alpha = loom::build(loom::model<models::TinyGpt>(small) | loom::lora(4, {"q_proj", "v_proj"}), one());
  CHECK_THROWS_WITH(other_alpha.load_adapter(folder),
                    ContainsSubstring("lora_alpha = 6.5, the plan alpha = 4") && ContainsSubstring("{.alpha = 6.5}"));
  auto other_layers =
      loom::build(loom::model<models::TinyGpt>(small) | loom::lora(4, {"q_proj"}, {.alpha = 6.5}), one());
  CHECK_THROWS_WITH(other_layers.load_adapter(folder),
                    ContainsSubstring("its layers differ from those the plan adapts: missing [], unexpected "
                                      "[blocks.0.attn.v_proj.lora_A"));
  CHECK_THROWS_AS(other_layers.load_adapter(scratch("nothing-here")), loom::peft_error);
}

TEST_CASE("rank_pattern, alpha_pattern, use_rslora and all-linear give each layer PEFT's rank and scale",
          "[peft][lora]") {
  // PEFT's rule: the first key whose (.*\.)?(key) matches the layer's whole name.
  const loom::lora_scaling_rules rules{.r = 4,
                                       .lora_alpha = 8,
                                       .use_rslora = false,
                                       .rank_pattern = {{"v_proj", 2}, {R"(blocks\.1\..*)", 6}, {"q_proj", 3}},
                                       .alpha_pattern = {{"blocks.0.attn.q_proj", 1}}};
  const auto layer = [&](const std::string& name) {
    const loom::lora_scaling_rules::layer l = rules.for_layer(name);
    return std::tuple{l.rank, l.alpha, l.scaling};
  };
  CHECK(layer("blocks.0.attn.q_proj") == std::tuple{std::int64_t{3}, 1.0, 1.0 / 3});
  CHECK(layer("blocks.1.attn.v_proj") == std::tuple{std::int64_t{2}, 8.0, 4.0});      // v_proj comes first
  CHECK(layer("blocks.1.attn.q_proj") == std::tuple{std::int64_t{6}, 8.0, 8.0 / 6});  // blocks.1 before q_proj
  CHECK(layer("blocks.0.attn.o_proj") == std::tuple{std::int64_t{4}, 8.0, 2.0});
  CHECK(layer("blocks.0.attn.xv_proj") == std::tuple{std::int64_t{4}, 8.0, 2.0});  // a key matches at a dot
  loom::lora_scaling_rules rs = rules;
  rs.use_rslora = true;
  CHECK(rs.for_layer("blocks.0.attn.o_proj").scaling == 4.0);  // 8 / √4
  rs.rank_pattern = {{"q_proj[", 2}};
  CHECK_THROWS_WITH(rs.for_layer("blocks.0.attn.q_proj"),
                    ContainsSubstring("lora rank_pattern key 'q_proj[' is not a regular expression"));

  // In the model: each layer's A and B of its rank, every linear layer under all-linear.
  constexpr auto options = loom::lora(4, {loom::all_linear},
                                      {.alpha = 8,
                                       .use_rslora = true,
                                       .rank_pattern = {{"v_proj", 2}, {"fc_in", 6}},
                                       .alpha_pattern = {{"o_proj", 2}}});
  auto job = loom::build(loom::model<models::TinyGpt>(small) | loom::seeded(1) | options, one());
  std::map<std::string, std::int64_t> ranks;
  for (const auto& item : job.module().named_parameters()) {
    if (item.key().ends_with(".lora_A")) ranks[item.key()] = item.value().size(0);
  }
  CHECK(ranks.at("blocks.0.attn.q_proj.lora_A") == 4);
  CHECK(ranks.at("blocks.0.attn.v_proj.lora_A") == 2);
  CHECK(ranks.at("blocks.1.fc_in.lora_A") == 6);
  CHECK(ranks.at("blocks.1.fc_out.lora_A") == 4);
  CHECK(ranks.size() == 6 * 2 + 1);  // q, k, v, o, fc_in, fc_out in each block, and the head: no output_embeddings
  CHECK_THAT(job.describe(), ContainsSubstring("use_rslora=true, rank_pattern={v_proj: 2, fc_in: 6}"));

  // The file carries them, and a plan with other patterns refuses it, naming the layer.
  const fs::path folder = scratch("patterns");
  job.save_adapter(folder);
  const loom::peft_lora_adapter written = loom::load_peft_adapter(folder);
  CHECK(written.use_rslora);
  CHECK(written.rank_pattern == std::vector<std::pair<std::string, std::int64_t>>{{"v_proj", 2}, {"fc_in", 6}});
  CHECK(written.alpha_pattern == std::vector<std::pair<std::string, double>>{{"o_proj", 2}});
  auto same = loom::build(loom::model<models::TinyGpt>(small) | loom::seeded(2) | options, one());
  same.load_adapter(folder);
  auto plain_scale = loom::build(
      loom::model<models::TinyGpt>(small) |
          loom::lora(4, {loom::all_linear},
                     {.alpha = 8, .rank_pattern = {{"v_proj", 2}, {"fc_in", 6}}, .alpha_pattern = {{"o_proj", 2}}}),
      one());
  CHECK_THROWS_WITH(plain_scale.load_adapter(folder),
                    ContainsSubstring("the adapter sets use_rslora and the plan does not"));
  auto other_alpha =
      loom::build(loom::model<models::TinyGpt>(small) |
                      loom::lora(4, {loom::all_linear},
                                 {.alpha = 8, .use_rslora = true, .rank_pattern = {{"v_proj", 2}, {"fc_in", 6}}}),
                  one());
  CHECK_THROWS_WITH(other_alpha.load_adapter(folder),
                    ContainsSubstring("'blocks.0.attn.o_proj' has rank 4 and alpha 2 by the adapter's rank_pattern and "
                                      "alpha_pattern, rank 4 and alpha 8 by the plan's"));
}

TEST_CASE("modules_to_save: whole modules trained, saved beside the adapters under PEFT's keys, and loaded back",
          "[peft][lora]") {
  constexpr auto saving = loom::lora(4, {"q_proj", "v_proj"}, {.alpha = 6.5, .modules_to_save = {"head"}});
  auto source = loom::build(loom::model<models::TinyGpt>(small) | loom::seeded(1) | saving, one());
  CHECK(source.module().head->weight.requires_grad());
  CHECK_FALSE(source.module().tok->weight.requires_grad());
  CHECK_THAT(source.describe(), ContainsSubstring("modules_to_save=[head]"));
  {
    torch::NoGradGuard no_grad;
    source.module().head->weight.add_(1.0);  // as training would move it
  }
  const fs::path folder = scratch("modules-to-save");
  source.save_adapter(folder);
  const loom::peft_lora_adapter written = loom::load_peft_adapter(folder);
  CHECK(written.modules_to_save == std::vector<std::string>{"head"});
  CHECK_FALSE(written.ensure_weight_tying);
  std::set<std::string> names;
  for (const loom::named_tensor& t : written.module_tensors) names.insert(t.name);
  CHECK(names == std::set<std::string>{"head.bias", "head.weight"});

  auto target = loom::build(loom::model<models::TinyGpt>(small) | loom::seeded(2) | saving, one());
  target.load_adapter(folder);
  CHECK(torch::equal(target.module().head->weight, source.module().head->weight));
  auto without = loom::build(loom::model<models::TinyGpt>(small) | loom::seeded(2) | adapted, one());
  CHECK_THROWS_WITH(without.load_adapter(folder),
                    ContainsSubstring("its modules to save differ from the plan's: missing [], unexpected [head.bias, "
                                      "head.weight] (the adapter's modules_to_save [head], the plan's [])"));
  auto other = loom::build(loom::model<models::TinyGpt>(small) |
                               loom::lora(4, {"q_proj", "v_proj"}, {.alpha = 6.5, .modules_to_save = {"ln_f"}}),
                           one());
  CHECK_THROWS_WITH(other.load_adapter(folder), ContainsSubstring("missing [ln_f.bias, ln_f.weight]"));
  CHECK_THROWS_WITH(source.save_adapter(scratch("no-pipeline-saving"), loom::adapter_format::diffusers),
                    ContainsSubstring("a diffusers LoRA file carries no modules_to_save ([head])"));
  CHECK_THROWS_WITH(
      loom::build(loom::model<models::TinyGpt>(small) | loom::lora(4, {"q_proj"}, {.modules_to_save = {"lm_head"}}),
                  one()),
      ContainsSubstring("lora modules_to_save 'lm_head' selects no module of"));
}

TEST_CASE("an adapter_config.json that is not a plain LoRA's, or holds the wrong kinds, is refused by name",
          "[peft][errors]") {
  const fs::path folder = scratch("config");
  loom::save_peft_adapter(folder, {.r = 2,
                                   .lora_alpha = 4,
                                   .target_modules = {"layers.0.q_proj"},
                                   .task_type = {},
                                   .base_model_name_or_path = {},
                                   .tensors = {{"layers.0.q_proj.lora_A", at::zeros({2, 4})},
                                               {"layers.0.q_proj.lora_B", at::zeros({4, 2})}}});
  const auto with = [&](const std::string& settings) {
    std::ofstream(folder / "adapter_config.json")
        << R"({"peft_type": "LORA", "r": 2, "lora_alpha": 4)" << settings << "}";
    return folder;
  };
  const auto refused = [&](const std::string& settings, const std::string& reason) {
    CAPTURE(settings);
    CHECK_THROWS_MATCHES(
        loom::load_peft_adapter(with(settings)), loom::peft_error,
        Catch::Matchers::MessageMatches(ContainsSubstring("the PEFT adapter in '" + folder.string() + "' " + reason)));
  };
  // PEFT writes an unset option as null.
  const loom::peft_lora_adapter read = loom::load_peft_adapter(
      with(R"(, "use_dora": null, "bias": null, "lora_dropout": 0.05, "target_modules": ["layers.0.q_proj"])"));
  CHECK(read.lora_dropout == 0.05);
  CHECK(read.target_modules == std::vector<std::string>{"layers.0.q_proj"});
  CHECK(loom::load_peft_adapter(with(R"(, "target_modules": "q_proj|v_proj")")).target_modules.empty());

  refused(R"(, "use_dora": true)", "is a DoRA adapter (use_dora)");
  // PEFT's rsLoRA and per-layer ranks and alphas read as written, the patterns in the file's order.
  const loom::peft_lora_adapter options = loom::load_peft_adapter(
      with(R"(, "use_rslora": true, "rank_pattern": {"v_proj": 4, "q_proj": 8}, "alpha_pattern": {"q_proj": 2.5})"));
  CHECK(options.use_rslora);
  REQUIRE(options.rank_pattern.size() == 2);
  CHECK(options.rank_pattern[0] == std::pair<std::string, std::int64_t>{"v_proj", 4});
  CHECK(options.rank_pattern[1] == std::pair<std::string, std::int64_t>{"q_proj", 8});
  CHECK(options.alpha_pattern == std::vector<std::pair<std::string, double>>{{"q_proj", 2.5}});
  refused(R"(, "rank_pattern": {"q_proj": 2.5})",
          "has rank_pattern 'q_proj': 2.5 in adapter_config.json, not a positive whole rank");
  refused(R"(, "alpha_pattern": {"q_proj": "2"})",
          "has a string for alpha_pattern 'q_proj' in adapter_config.json, not a number");
  refused(R"(, "rank_pattern": [4])", "has an array for rank_pattern in adapter_config.json, not an object");
  refused(R"(, "bias": "lora_only")", "trains biases (bias 'lora_only')");
  // What the fuzzer found (tests/fuzz/corpus/peft-config): a value of another kind escaped as
  // nlohmann's type_error, naming no file.
  std::ofstream(folder / "adapter_config.json") << R"({"peft_type": true, "r": 2, "lora_alpha": 4})";
  CHECK_THROWS_WITH(loom::load_peft_adapter(folder),
                    ContainsSubstring("has a boolean for peft_type in adapter_config.json, not a string"));
  refused(R"(, "use_dora": 1)", "has a number for use_dora in adapter_config.json, not true or false");
  refused(R"(, "bias": false)", "has a boolean for bias in adapter_config.json, not a string");
  refused(R"(, "lora_dropout": "0.1")", "has a string for lora_dropout in adapter_config.json, not a number");
  refused(R"(, "lora_dropout": 1.5)", "has lora_dropout 1.5 in adapter_config.json, not a probability in [0, 1]");
  refused(R"(, "target_modules": ["q_proj", 3])", "has a number among target_modules in adapter_config.json");
  refused(R"(, "target_modules": {"q_proj": 1})", "has an object for target_modules in adapter_config.json");

  // A weight key as short as its prefix and suffix together.
  loom::save_safetensors(folder / "adapter_model.safetensors", {{"base_model.model.weight", at::zeros({1})}});
  refused("", "holds 'base_model.model.weight', not a key of the form base_model.model.<layer>.lora_A.weight");
}

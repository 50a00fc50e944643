// loom::models::Wan without diffusers: wan_config::from_json against config.json as diffusers writes
// it, each refusal's sentence, the module's names and shapes (diffusers' own, so that checkpoints
// load by name), what is kept in fp32, the units, the LoRA targets, a construction without bytes, and
// the forward's refusals. tests/models/wan_vs_diffusers.py checks the values against diffusers.
#include <loom/io/safetensors.hpp>
#include <loom/loom.hpp>
#include <loom/models/wan.hpp>
#include <loom/nn/deferred_init.hpp>
#include <loom/precision/precision.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

using Catch::Matchers::ContainsSubstring;
using loom::models::wan_config;

namespace {

// config.json as diffusers 0.42 saves a small WanTransformer3DModel; `extra` keys, last, replace
// those of the same name.
std::string config_json(const std::string& extra = "") {
  return R"({"_class_name": "WanTransformer3DModel", "_diffusers_version": "0.42.1", "added_kv_proj_dim": null,
    "attention_head_dim": 12, "cross_attn_norm": true, "eps": 1e-06, "ffn_dim": 40, "freq_dim": 16,
    "image_dim": null, "in_channels": 4, "num_attention_heads": 3, "num_layers": 1, "out_channels": 4,
    "patch_size": [1, 2, 2], "pos_embed_seq_len": null, "qk_norm": "rms_norm_across_heads",
    "rope_max_seq_len": 32, "text_dim": 20)" +
         extra + "}";
}

wan_config tiny() { return wan_config::from_json(config_json(), "config.json"); }

std::string refused(const std::string& text) {
  try {
    (void)wan_config::from_json(text, "transformer/config.json");
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  return "accepted";
}

}  // namespace

TEST_CASE("config.json as diffusers writes it, and diffusers' defaults for the keys it leaves out", "[wan]") {
  const wan_config config = tiny();
  CHECK(config.patch_size == std::array<std::int64_t, 3>{1, 2, 2});
  CHECK(config.num_attention_heads == 3);
  CHECK(config.attention_head_dim == 12);
  CHECK(config.inner_dim() == 36);
  CHECK(config.in_channels == 4);
  CHECK(config.out_channels == 4);
  CHECK(config.text_dim == 20);
  CHECK(config.freq_dim == 16);
  CHECK(config.ffn_dim == 40);
  CHECK(config.num_layers == 1);
  CHECK(config.cross_attn_norm);
  CHECK(config.eps == 1e-6);
  CHECK(config.rope_max_seq_len == 32);
  CHECK_FALSE(config.image_dim);

  // diffusers takes `out_channels or in_channels`.
  CHECK(wan_config::from_json(config_json(R"(, "out_channels": null, "in_channels": 48)"), "c").out_channels == 48);
  const wan_config defaults = wan_config::from_json("{}", "c");
  CHECK(defaults.patch_size == std::array<std::int64_t, 3>{1, 2, 2});
  CHECK(defaults.num_attention_heads == 40);
  CHECK(defaults.attention_head_dim == 128);
  CHECK(defaults.out_channels == 16);
  CHECK(defaults.text_dim == 4096);
  CHECK(defaults.ffn_dim == 13824);
  CHECK(defaults.num_layers == 40);
  CHECK(defaults.cross_attn_norm);
  CHECK(defaults.qk_norm == "rms_norm_across_heads");
  CHECK(defaults.rope_max_seq_len == 1024);
}

TEST_CASE("a config.json loom cannot build is one sentence naming the file and the key", "[wan][errors]") {
  CHECK_THAT(refused(config_json(R"(, "image_dim": 1280)")),
             ContainsSubstring("Wan config 'transformer/config.json': 'image_dim' is 1280: image conditioning (Wan "
                               "2.1 I2V and FLF2V) is not supported"));
  CHECK_THAT(refused(config_json(R"(, "added_kv_proj_dim": 5120)")),
             ContainsSubstring("'added_kv_proj_dim' is 5120: the image keys and values of image conditioning"));
  CHECK_THAT(refused(config_json(R"(, "qk_norm": "rms_norm")")),
             ContainsSubstring("'qk_norm' is \"rms_norm\": loom's Wan normalises queries and keys with one RMSNorm "
                               "across heads") &&
                 ContainsSubstring("give \"rms_norm_across_heads\""));
  CHECK_THAT(refused(config_json(R"(, "qk_norm": null)")), ContainsSubstring("'qk_norm' is null"));
  CHECK_THAT(refused(config_json(R"(, "attention_head_dim": 9)")),
             ContainsSubstring("'attention_head_dim' is 9, odd: the rotary embedding turns pairs"));
  CHECK_THAT(refused(config_json(R"(, "_class_name": "WanVACETransformer3DModel")")),
             ContainsSubstring("'_class_name' is \"WanVACETransformer3DModel\": loom::models::Wan reads "
                               "WanTransformer3DModel checkpoints"));
  // A language model's config.json, whose sizes Wan's defaults would otherwise fill in around.
  CHECK_THAT(refused(R"({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64})"),
             ContainsSubstring("'architectures' is [\"Qwen3ForCausalLM\"]: a transformers model, not a diffusers "
                               "WanTransformer3DModel") &&
                 ContainsSubstring("give a Wan transformer's folder"));
  CHECK_THAT(refused(config_json(R"(, "patch_size": [2, 2])")),
             ContainsSubstring("'patch_size' is [2,2]: give three positive whole numbers, frames, height and width"));
  CHECK_THAT(refused(config_json(R"(, "num_layers": "1")")),
             ContainsSubstring("'num_layers' is \"1\": give a positive whole number"));
  CHECK_THAT(refused(config_json(R"(, "cross_attn_norm": 1)")), ContainsSubstring("'cross_attn_norm' is 1: give true"));
  CHECK_THAT(refused("not json"), ContainsSubstring("not a JSON object"));
  CHECK_THROWS_WITH(wan_config::from_pretrained("/nonexistent/transformer"),
                    ContainsSubstring("cannot be read: give the transformer's folder holding config.json"));

  wan_config in_code = tiny();  // a config made in code is held to the same
  in_code.image_dim = 1280;
  CHECK_THROWS_WITH(loom::models::Wan(in_code), ContainsSubstring("loom::models::Wan: 'image_dim' is 1280"));
}

TEST_CASE("the module's names and shapes are diffusers' state_dict, in its order", "[wan]") {
  loom::models::Wan model(tiny());
  // WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=3, attention_head_dim=12,
  // in_channels=4, out_channels=4, text_dim=20, freq_dim=16, ffn_dim=40, num_layers=1).state_dict()
  const std::vector<std::pair<std::string, std::vector<std::int64_t>>> expected{
      {"scale_shift_table", {1, 2, 36}},
      {"patch_embedding.weight", {36, 4, 1, 2, 2}},
      {"patch_embedding.bias", {36}},
      {"condition_embedder.time_embedder.linear_1.weight", {36, 16}},
      {"condition_embedder.time_embedder.linear_1.bias", {36}},
      {"condition_embedder.time_embedder.linear_2.weight", {36, 36}},
      {"condition_embedder.time_embedder.linear_2.bias", {36}},
      {"condition_embedder.time_proj.weight", {216, 36}},
      {"condition_embedder.time_proj.bias", {216}},
      {"condition_embedder.text_embedder.linear_1.weight", {36, 20}},
      {"condition_embedder.text_embedder.linear_1.bias", {36}},
      {"condition_embedder.text_embedder.linear_2.weight", {36, 36}},
      {"condition_embedder.text_embedder.linear_2.bias", {36}},
      {"blocks.0.scale_shift_table", {1, 6, 36}},
      {"blocks.0.attn1.to_q.weight", {36, 36}},
      {"blocks.0.attn1.to_q.bias", {36}},
      {"blocks.0.attn1.to_k.weight", {36, 36}},
      {"blocks.0.attn1.to_k.bias", {36}},
      {"blocks.0.attn1.to_v.weight", {36, 36}},
      {"blocks.0.attn1.to_v.bias", {36}},
      {"blocks.0.attn1.to_out.0.weight", {36, 36}},
      {"blocks.0.attn1.to_out.0.bias", {36}},
      {"blocks.0.attn1.norm_q.weight", {36}},
      {"blocks.0.attn1.norm_k.weight", {36}},
      {"blocks.0.attn2.to_q.weight", {36, 36}},
      {"blocks.0.attn2.to_q.bias", {36}},
      {"blocks.0.attn2.to_k.weight", {36, 36}},
      {"blocks.0.attn2.to_k.bias", {36}},
      {"blocks.0.attn2.to_v.weight", {36, 36}},
      {"blocks.0.attn2.to_v.bias", {36}},
      {"blocks.0.attn2.to_out.0.weight", {36, 36}},
      {"blocks.0.attn2.to_out.0.bias", {36}},
      {"blocks.0.attn2.norm_q.weight", {36}},
      {"blocks.0.attn2.norm_k.weight", {36}},
      {"blocks.0.norm2.weight", {36}},
      {"blocks.0.norm2.bias", {36}},
      {"blocks.0.ffn.net.0.proj.weight", {40, 36}},
      {"blocks.0.ffn.net.0.proj.bias", {40}},
      {"blocks.0.ffn.net.2.weight", {36, 40}},
      {"blocks.0.ffn.net.2.bias", {36}},
      {"proj_out.weight", {16, 36}},
      {"proj_out.bias", {16}},
  };
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> actual;
  for (const auto& item : model->named_parameters()) actual.emplace_back(item.key(), item.value().sizes().vec());
  CHECK(actual == expected);
  CHECK(model->named_buffers().is_empty());  // the rotary tables are computed, in no state_dict

  wan_config without_norm = tiny();
  without_norm.cross_attn_norm = false;
  const auto names = loom::models::Wan(without_norm)->named_parameters().keys();
  CHECK(names.size() == expected.size() - 2);
  CHECK(std::find(names.begin(), names.end(), "blocks.0.norm2.weight") == names.end());
}

TEST_CASE("built in bf16, what diffusers keeps in fp32 is fp32", "[wan][precision]") {
  const loom::default_dtype_scope narrow(loom::bf16);
  loom::models::Wan model(tiny());
  for (const auto& item : model->named_parameters()) {
    CAPTURE(item.key());
    const std::string& name = item.key();
    const bool kept = name.find("scale_shift_table") != std::string::npos ||
                      name.find("time_embedder") != std::string::npos || name.find("norm2") != std::string::npos;
    CHECK(item.value().scalar_type() == (kept ? at::kFloat : at::kBFloat16));
  }
}

TEST_CASE("each transformer block is a unit of sharding and recomputation", "[wan]") {
  wan_config config = tiny();
  config.num_layers = 3;
  loom::models::Wan model(config);
  const std::vector<loom::nn::unit_module> units = loom::nn::find_units(*model);
  REQUIRE(units.size() == 3);
  CHECK(units[0].name == "blocks.0");
  CHECK(units[2].name == "blocks.2");
  CHECK(model->blocks[1]->as<loom::models::WanTransformerBlock>() != nullptr);
}

TEST_CASE("LoRA's targets are diffusers' names: to_q, to_k, to_v and to_out.0, and FastVideo's to_out is to_out.0",
          "[wan][lora]") {
  namespace fs = std::filesystem;
  const auto base = loom::model<loom::models::Wan>(tiny()) | loom::seeded(1);
  const auto adapted = [](auto& job) {
    std::vector<std::string> names;
    for (const auto& item : job.module()->named_parameters()) {
      if (item.key().ends_with(".lora_A")) names.push_back(item.key().substr(0, item.key().size() - 7));
    }
    return names;
  };
  const std::vector<std::string> projections{"blocks.0.attn1.to_q",     "blocks.0.attn1.to_k",    "blocks.0.attn1.to_v",
                                             "blocks.0.attn1.to_out.0", "blocks.0.attn2.to_q",    "blocks.0.attn2.to_k",
                                             "blocks.0.attn2.to_v",     "blocks.0.attn2.to_out.0"};
  auto diffusers_names = loom::build(base | loom::lora(4, {"to_q", "to_k", "to_v", "to_out.0"}) | loom::local(),
                                     loom::runtime::single_process());
  CHECK(adapted(diffusers_names) == projections);
  // FastVideo's default targets: its Wan calls the projection to_out, and so may a path's end.
  auto fastvideo_names = loom::build(base | loom::lora(4, {"to_q", "to_k", "to_v", "to_out"}) | loom::local(),
                                     loom::runtime::single_process());
  CHECK(adapted(fastvideo_names) == projections);
  auto one_path = loom::build(base | loom::lora(4, {"attn2.to_out"}, {.exclude = {"attn1.to_out"}}) | loom::local(),
                              loom::runtime::single_process());
  CHECK(adapted(one_path) == std::vector<std::string>{"blocks.0.attn2.to_out.0"});
  // The adapter keeps diffusers' names, which PEFT loads onto diffusers' model.
  const fs::path folder = fs::temp_directory_path() / "loom-test-wan-fastvideo-targets";
  fs::remove_all(folder);
  fastvideo_names.save_adapter(folder);
  std::ifstream config(folder / "adapter_config.json");
  const std::string config_text((std::istreambuf_iterator<char>(config)), {});
  CHECK_THAT(config_text, ContainsSubstring(R"("blocks.0.attn1.to_out.0")"));
  const std::vector<loom::named_tensor> saved = loom::load_safetensors(folder / "adapter_model.safetensors").tensors;
  CHECK(std::any_of(saved.begin(), saved.end(), [](const loom::named_tensor& t) {
    return t.name == "base_model.model.blocks.0.attn1.to_out.0.lora_A.weight";
  }));
  fs::remove_all(folder);
  // A pattern is the model's own names: as in PEFT, one that selects the list is refused.
  CHECK_THROWS_WITH(loom::build(base | loom::lora(4, {loom::pattern(R"(blocks\.0\.attn1\.to_out)")}) | loom::local(),
                                loom::runtime::single_process()),
                    ContainsSubstring("lora target selects 'blocks.0.attn1.to_out'") &&
                        ContainsSubstring("which is not a linear layer"));
}

TEST_CASE("LoRA trains through the blocks, and recompute() gives the same gradients, bit for bit",
          "[wan][lora][recompute]") {
  const auto adapted = loom::model<loom::models::Wan>(tiny()) | loom::seeded(1) | loom::lora(4, {"to_q", "to_out.0"});
  auto plain = loom::build(adapted | loom::local(), loom::runtime::single_process());
  auto recomputed = loom::build(adapted | loom::recompute() | loom::local(), loom::runtime::single_process());
  const auto gradients = [](auto& job) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(5);
    for (const at::Tensor& parameter : job.trainable_parameters()) {  // B of zero would pass no gradient to A
      torch::NoGradGuard no_grad;
      at::Tensor(parameter).normal_(0, 0.1, generator);
    }
    const at::Tensor velocity = job.forward(torch::randn({2, 4, 3, 4, 6}, generator), torch::tensor({3.0, 700.0}),
                                            torch::randn({2, 5, 20}, generator));
    job.backward(velocity.square().mean());
    std::vector<at::Tensor> grads;
    for (const at::Tensor& parameter : job.trainable_parameters()) grads.push_back(parameter.grad().clone());
    return grads;
  };
  const std::vector<at::Tensor> expected = gradients(plain);
  const std::vector<at::Tensor> actual = gradients(recomputed);
  REQUIRE(expected.size() == 8);  // A and B of to_q and to_out.0 in both attentions
  REQUIRE(actual.size() == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    CAPTURE(i);
    CHECK(expected[i].abs().max().item<double>() > 0);
    CHECK(torch::equal(actual[i], expected[i]));
  }
}

TEST_CASE("the model is constructed without its bytes: every parameter's initialisation is recorded",
          "[wan][deferred]") {
  loom::nn::deferred_init records;
  std::optional<loom::models::Wan> model;
  {
    const loom::nn::deferred_init::scope deferring(records);
    model.emplace(tiny());
  }
  CHECK_FALSE(records.accept(**model));
  CHECK(records.size() == (*model)->parameters().size());
  for (const at::Tensor& parameter : (*model)->parameters()) CHECK_FALSE(loom::nn::has_bytes(parameter));

  // Wan 2.1 T2V 1.3B's sizes (diffusers' config.json left to its defaults but for these), without
  // its 5.7 GB: diffusers' count of parameters and tensors.
  const wan_config published = wan_config::from_json(
      R"({"_class_name": "WanTransformer3DModel", "num_attention_heads": 12, "ffn_dim": 8960, "num_layers": 30})",
      "Wan2.1-T2V-1.3B-Diffusers/transformer/config.json");
  loom::nn::deferred_init published_records;
  std::optional<loom::models::Wan> large;
  {
    const loom::nn::deferred_init::scope deferring(published_records);
    large.emplace(published);
  }
  CHECK_FALSE(published_records.accept(**large));
  std::int64_t count = 0;
  for (const at::Tensor& parameter : (*large)->parameters()) count += parameter.numel();
  CHECK(count == 1'418'996'800);
  CHECK((*large)->parameters().size() == 825);
}

TEST_CASE("the forward gives the velocity of whole patches and refuses what it cannot compute", "[wan][errors]") {
  wan_config config = tiny();
  config.patch_size = {2, 2, 2};
  config.rope_max_seq_len = 4;
  loom::models::Wan model(config);
  torch::NoGradGuard no_grad;
  const at::Tensor text = torch::randn({2, 5, 20});
  // Frames, height and width rounded down to whole patches, as diffusers' strided convolution drops the rest.
  CHECK(model(torch::randn({2, 4, 5, 4, 7}), torch::tensor({10.0, 500.0}), text).sizes() ==
        at::IntArrayRef{2, 4, 4, 4, 6});
  // A timestep a token (Wan 2.2 TI2V's expand_timesteps), each sample's the same on all its tokens, is the
  // timestep a sample, within fp32 rounding (the time projection multiplies matrices of other shapes);
  // one per token otherwise, of the patches' number.
  const at::Tensor latents = torch::randn({2, 4, 4, 4, 4});  // 2x2x2 = 8 patches
  const at::Tensor per_sample = torch::tensor({10.0, 500.0});
  const at::Tensor sampled = model(latents, per_sample, text);
  const at::Tensor tokened = model(latents, per_sample.unsqueeze(1).expand({2, 8}).contiguous(), text);
  CHECK((tokened - sampled).abs().max().item<double>() <= 1e-5 * sampled.abs().max().item<double>());
  const at::Tensor shifted = model(latents, (per_sample.unsqueeze(1) + torch::arange(8) * 50.0).contiguous(), text);
  CHECK((shifted - sampled).abs().max().item<double>() > 1e-3 * sampled.abs().max().item<double>());
  CHECK_THROWS_WITH(model(latents, torch::ones({2, 7}), text),
                    ContainsSubstring("the timesteps are [2, 7], one a token, but the latents make 2 × 8 patches "
                                      "(2x2x2): give [2, 8], as WanPipeline's expand_timesteps makes them"));
  CHECK_THROWS_WITH(model(latents, torch::ones({2, 8, 1}), text),
                    ContainsSubstring("the timestep is 3-dimensional: give one a sample, [batch], or one a token"));
  CHECK_THROWS_WITH(model(torch::randn({2, 4, 4, 4, 10}), torch::ones({2}), text),
                    ContainsSubstring("the latents make 2x2x5 patches (frames, height, width), more along one axis "
                                      "than rope_max_seq_len = 4 rotary positions"));
  CHECK_THROWS_WITH(model(torch::randn({2, 4, 4, 4}), torch::ones({2}), text),
                    ContainsSubstring("the latents are 4-dimensional"));
}

TEST_CASE("a diffusers checkpoint's adapters go to diffusers' file and PEFT's folder, its weights to diffusers' names",
          "[wan][lora][files]") {
  namespace fs = std::filesystem;
  const fs::path folder = fs::temp_directory_path() / "loom-test-wan-files";
  fs::remove_all(folder);
  const auto base = loom::model<loom::models::Wan>(tiny());
  {
    auto saved = loom::build(base | loom::seeded(1) | loom::local(), loom::runtime::single_process());
    loom::save_weights(folder / "checkpoint", saved.state_dict(), loom::default_max_shard_bytes,
                       loom::weights_naming::diffusers);
    std::ofstream(folder / "checkpoint" / "config.json") << config_json();
  }
  const auto adapted = base | loom::seeded(2) | loom::pretrained((folder / "checkpoint").string()) |
                       loom::lora(2, {"to_q"}, {.alpha = 3});
  auto job = loom::build(adapted | loom::local(), loom::runtime::single_process());
  {
    torch::NoGradGuard no_grad;
    auto generator = at::make_generator<at::CPUGeneratorImpl>(5);
    for (const at::Tensor& parameter : job.trainable_parameters()) at::Tensor(parameter).normal_(0, 0.1, generator);
  }
  job.save_adapter(folder / "diffusers", loom::adapter_format::diffusers);
  job.save_adapter(folder / "peft");

  // diffusers' keys and the LoraConfig under the pipeline's name for the model.
  const loom::safetensors_content file =
      loom::load_safetensors(folder / "diffusers" / "pytorch_lora_weights.safetensors");
  CHECK(file.tensors.front().name == "transformer.blocks.0.attn1.to_q.lora_A.weight");
  const std::string metadata = file.metadata.at("lora_adapter_metadata");
  CHECK_THAT(metadata, ContainsSubstring(R"("transformer.lora_alpha": 3)") &&
                           ContainsSubstring(R"("transformer.r": 2)") &&
                           ContainsSubstring(R"("transformer.target_modules": [)"));
  // PEFT has no task for a diffusers model: auto_mapping names the class AutoPeftModel loads.
  std::ifstream config(folder / "peft" / "adapter_config.json");
  const std::string peft_config((std::istreambuf_iterator<char>(config)), {});
  CHECK_THAT(peft_config,
             ContainsSubstring(R"("task_type": null)") &&
                 ContainsSubstring(R"("base_model_class": "WanTransformer3DModel")") &&
                 ContainsSubstring(R"("parent_library": "diffusers.models.transformers.transformer_wan")"));

  const auto adapters = [](auto& of) {
    std::vector<at::Tensor> copies;
    for (const at::Tensor& parameter : of.trainable_parameters()) copies.push_back(parameter.detach().clone());
    return copies;
  };
  const auto same = [](const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(),
                                              [](const at::Tensor& x, const at::Tensor& y) { return x.equal(y); });
  };
  for (const auto format : {loom::adapter_format::diffusers, loom::adapter_format::peft}) {
    auto reloaded = loom::build(adapted | loom::local(), loom::runtime::single_process());
    reloaded.load_adapter(folder / (format == loom::adapter_format::diffusers ? "diffusers" : "peft"), format);
    CHECK(same(adapters(reloaded), adapters(job)));
  }
  CHECK_THROWS_WITH(job.load_adapter(folder / "diffusers"),
                    ContainsSubstring("has no adapter_config.json but diffusers' pytorch_lora_weights.safetensors: "
                                      "read that with loom::adapter_format::diffusers"));
  CHECK_THROWS_WITH(job.load_adapter(folder / "peft", loom::adapter_format::diffusers),
                    ContainsSubstring("holds no pytorch_lora_weights.safetensors but PEFT's adapter_config.json"));
  // Without its LoraConfig, as older diffusers wrote it, the file is read as diffusers reads it: alpha = r.
  loom::save_safetensors(folder / "older.safetensors", file.tensors);
  CHECK_THROWS_WITH(job.load_adapter(folder / "older.safetensors", loom::adapter_format::diffusers),
                    ContainsSubstring("the adapter has lora_alpha = 2, the plan alpha = 3"));
  // Another component's adapters (a text encoder's) are not this model's.
  std::vector<loom::named_tensor> renamed = file.tensors;
  renamed.front().name = "text_encoder.layers.0.q.lora_A.weight";
  loom::save_safetensors(folder / "other.safetensors", renamed, file.metadata);
  CHECK_THROWS_WITH(job.load_adapter(folder / "other.safetensors", loom::adapter_format::diffusers),
                    ContainsSubstring("holds 'text_encoder.layers.0.q.lora_A.weight', not a key of the form "
                                      "transformer.<layer>.lora_A.weight"));

  // The merged model under the checkpoint's (diffusers') names, in shards with diffusers' index.
  job.merge();
  job.save_pretrained(folder / "merged", /*max_shard_bytes=*/16 * 1024);
  CHECK(fs::exists(folder / "merged" / "config.json"));
  CHECK(fs::exists(folder / "merged" / "diffusion_pytorch_model.safetensors.index.json"));
  const auto shards = std::count_if(fs::directory_iterator(folder / "merged"), fs::directory_iterator(),
                                    [](const fs::directory_entry& entry) {
                                      return entry.path().filename().string().starts_with("diffusion_pytorch_model-0");
                                    });
  CHECK(shards > 1);
  CHECK_FALSE(fs::exists(folder / "merged" / "model.safetensors.index.json"));
}

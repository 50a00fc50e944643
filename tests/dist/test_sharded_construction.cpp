// fsdp() constructing a model without the full replica (loom/nn/deferred_init.hpp): each rank's
// shards equal, bit for bit, those of a full construction, for a TORCH_MODULE holder
// (loom::models::CausalLM, tied and untied) and a Module subclass (TinyGpt), seeded or not, with LoRA,
// a narrower default dtype and mixed precision; the generator left as a full construction leaves
// it; training from there equal to local()'s; models that must be constructed whole say which
// layers forced it and still equal local(); a bad checkpoint is refused on every rank.
#include "same_state.hpp"
#include "world.hpp"

#include <models/tiny_gpt.hpp>

#include <loom/loom.hpp>
#include <loom/models/causal_lm.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/optim/adamw.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <filesystem>
#include <string>

using Catch::Matchers::ContainsSubstring;
using loom::testing::check_bit_equal;
using loom::testing::check_same_state;
using loom::testing::world;

namespace {

loom::models::causal_lm_config small_llama(bool tied) {
  loom::models::causal_lm_config config;
  config.vocab_size = 61;  // no world size divides it: the last rank's shard is short
  config.hidden_size = 32;
  config.intermediate_size = 56;
  config.num_hidden_layers = 3;
  config.num_attention_heads = 4;
  config.num_key_value_heads = 2;
  config.head_dim = 8;
  config.tie_word_embeddings = tied;
  return config;
}

at::Tensor generator_state() { return at::detail::getDefaultCPUGenerator().get_state(); }

// `plan` built whole in this process (local()) and by fsdp() over the world, each from the same
// default generator state: equal states, and the generator left in the same state by both.
template <class Plan>
void check_against_full_construction(const Plan& plan, bool expect_deferred) {
  torch::manual_seed(77);
  auto reference = loom::build(plan | loom::local(), loom::runtime::single_process());
  const at::Tensor after_reference = generator_state();
  torch::manual_seed(77);
  auto sharded = loom::build(plan | loom::fsdp(), world());
  CHECK(torch::equal(generator_state(), after_reference));
  const std::string described = sharded.describe();
  CAPTURE(described);
  CHECK((described.find("constructed without the full replica") != std::string::npos) == expect_deferred);
  check_bit_equal(reference, sharded);
}

}  // namespace

TEST_CASE("fsdp constructs a Llama without the full replica: every rank's shards are full construction's",
          "[construction]") {
  const bool tied = GENERATE(false, true);
  CAPTURE(tied);
  const auto base = loom::model<loom::models::CausalLM>(small_llama(tied));
  SECTION("seeded") { check_against_full_construction(base | loom::seeded(3), true); }
  SECTION("not seeded: rank 0's generator, as rank 0's weights are broadcast") {
    check_against_full_construction(base, true);
  }
  SECTION("seeded, with LoRA adapters drawn after the model") {
    check_against_full_construction(base | loom::seeded(4) | loom::lora(4, {"q_proj", "v_proj", "down_proj"}), true);
  }
  SECTION("built in bf16 under mixed precision: the trainable held in fp32") {
    check_against_full_construction(base | loom::seeded(5) | loom::default_dtype(loom::bf16) |
                                        loom::lora(4, {"q_proj", "v_proj"}) | loom::mixed_precision(),
                                    true);
  }
}

TEST_CASE("a Module subclass of loom's layers (TinyGpt) is constructed without the full replica", "[construction]") {
  const models::tiny_gpt_config config{.vocab = 37, .d = 16, .layers = 3, .heads = 2, .ctx = 12};
  check_against_full_construction(loom::model<models::TinyGpt>(config) | loom::seeded(6), true);
  check_against_full_construction(loom::model<models::TinyGpt>(config) | loom::seeded(6) | loom::lora(2, {"q_proj"}),
                                  true);
}

TEST_CASE("training a model constructed without the full replica equals local()'s", "[construction][train]") {
  const auto plan = loom::model<loom::models::CausalLM>(small_llama(false)) | loom::seeded(8) |
                    loom::lora(4, {"q_proj", "v_proj"}) | loom::trainable({"model.norm"});
  auto reference = loom::build(plan | loom::local(), loom::runtime::single_process());
  auto sharded = loom::build(plan | loom::fsdp(), world());
  torch::optim::AdamW reference_optimizer(reference.trainable_parameters(), torch::optim::AdamWOptions(1e-2));
  torch::optim::AdamW sharded_optimizer(sharded.trainable_parameters(), torch::optim::AdamWOptions(1e-2));
  const int ranks = world().world_size();
  for (int step = 0; step < 3; ++step) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(500 + step);
    const at::Tensor ids = torch::randint(61, {2 * ranks, 6}, generator);
    reference.backward(loom::models::causal_lm_loss(reference.forward(ids), ids));
    reference_optimizer.step();
    reference.zero_grad();
    const at::Tensor mine = ids.narrow(0, 2 * world().rank(), 2);
    sharded.backward(loom::models::causal_lm_loss(sharded.forward(mine), mine));
    sharded_optimizer.step();
    sharded.zero_grad();
  }
  check_same_state(reference, sharded, 1e-5);
}

namespace {

// Its constructor initialises a loom::nn::Linear's weight itself, as GPT-2's code does.
struct custom_init_block : torch::nn::Module {
  custom_init_block() : proj(register_module("proj", loom::nn::Linear(6, 6))) {
    torch::nn::init::normal_(proj->weight, 0, 0.02);
  }
  at::Tensor forward(const at::Tensor& x) { return proj(x); }
  loom::nn::Linear proj;
};

struct custom_init_model : torch::nn::Module {
  custom_init_model() : block(register_module("block", std::make_shared<loom::nn::Unit<custom_init_block>>())) {}
  at::Tensor forward(const at::Tensor& x) { return block->forward(x); }
  std::shared_ptr<loom::nn::Unit<custom_init_block>> block;
};

// The same initialisation, through loom::nn::initialise: recorded after the layer's own, which it replaces.
struct recorded_init_block : torch::nn::Module {
  recorded_init_block() : proj(register_module("proj", loom::nn::Linear(6, 6))) {
    loom::nn::initialise(proj->weight, {[](at::Tensor& w) { torch::nn::init::normal_(w, 0, 0.02); }});
    loom::nn::initialise(proj->bias, {[](at::Tensor& b) { b.zero_(); }, /*draws=*/false});
  }
  at::Tensor forward(const at::Tensor& x) { return proj(x); }
  loom::nn::Linear proj;
};

struct recorded_init_model : torch::nn::Module {
  recorded_init_model()
      : first(register_module("first", std::make_shared<loom::nn::Unit<recorded_init_block>>())),
        second(register_module("second", std::make_shared<loom::nn::Unit<recorded_init_block>>())) {}
  at::Tensor forward(const at::Tensor& x) { return second->forward(first->forward(x)); }
  std::shared_ptr<loom::nn::Unit<recorded_init_block>> first, second;
};

}  // namespace

TEST_CASE("a constructor's own initialisation through loom::nn::initialise is replayed after the layer's",
          "[construction]") {
  check_against_full_construction(loom::model<recorded_init_model>() | loom::seeded(11), true);
  check_against_full_construction(loom::model<recorded_init_model>(), true);
}

TEST_CASE("a model that cannot be constructed without its bytes is constructed whole, saying which layers forced it",
          "[construction][fallback]") {
  SECTION("plain torch::nn layers that draw their own weights") {
    const models::tiny_gpt_config config{.vocab = 37, .d = 16, .layers = 2, .heads = 2, .ctx = 12};
    const auto plan = loom::model<models::BasicTinyGpt<torch::nn::Linear>>(config) | loom::seeded(9);
    check_against_full_construction(plan, false);
    auto sharded = loom::build(plan | loom::fsdp(), world());
    CHECK_THAT(sharded.describe(),
               ContainsSubstring("constructed whole on every rank: torch::nn::EmbeddingImpl (tok, pos), "
                                 "torch::nn::LinearImpl (blocks.0.attn.q_proj, blocks.0.attn.k_proj") &&
                   ContainsSubstring("initialise their own weights as they are constructed"));
  }
  SECTION("a constructor that initialises a loom layer's weight itself") {
    const auto plan = loom::model<custom_init_model>() | loom::seeded(10);
    check_against_full_construction(plan, false);
    auto sharded = loom::build(plan | loom::fsdp(), world());
    CHECK_THAT(sharded.describe(), ContainsSubstring("constructed whole on every rank: its constructor writes "
                                                     "'block.proj.weight'"));
  }
}

TEST_CASE("a checkpoint that does not fit is refused on every rank, naming the file or the tensor, before any step",
          "[construction][pretrained][errors]") {
  namespace fs = std::filesystem;
  const fs::path folder =
      fs::temp_directory_path() / ("loom-test-sharded-construction-" + std::to_string(world().world_size()));
  const loom::models::causal_lm_config config = small_llama(false);
  const auto base = loom::model<loom::models::CausalLM>(config);
  const auto build = [&] {
    return loom::build(base | loom::seeded(2) | loom::pretrained(folder.string()) | loom::fsdp(), world());
  };
  const auto save = [&](const loom::models::causal_lm_config& saved_config, std::int64_t max_shard_bytes) {
    if (world().rank() == 0) fs::remove_all(folder);
    auto saved =
        loom::build(loom::model<loom::models::CausalLM>(saved_config) | loom::seeded(1) | loom::fsdp(), world());
    saved.save_weights(folder, max_shard_bytes);
  };
  save(config, 20'000);
  {
    auto loaded = build();
    CHECK_THAT(loaded.describe(), ContainsSubstring("constructed without the full replica") &&
                                      ContainsSubstring("bytes read on this rank"));
  }
  fs::path second;
  for (const auto& file : fs::directory_iterator(folder)) {
    if (file.path().filename().string().starts_with("model-00002-of-")) second = file.path();
  }
  REQUIRE(!second.empty());
  const auto barrier = [] {
    at::Tensor token = torch::zeros({1});
    world().comm().all_reduce(token).wait();
  };
  barrier();
  if (world().rank() == 0) fs::rename(second, folder / "aside");
  barrier();
  CHECK_THROWS_WITH(build(), ContainsSubstring(second.string()));
  barrier();
  if (world().rank() == 0) {
    fs::rename(folder / "aside", second);
    fs::resize_file(second, fs::file_size(second) - 7);
  }
  barrier();
  CHECK_THROWS_WITH(build(), ContainsSubstring(fmt::format("'{}' is not a valid safetensors file", second.string())));
  barrier();
  loom::models::causal_lm_config wider = config;
  wider.intermediate_size = 64;
  save(wider, std::int64_t{1} << 30);
  CHECK_THROWS_WITH(build(), ContainsSubstring("'model.layers.0.mlp.gate_proj.weight' is Float[64,32] in the weights "
                                               "but Float[56,32] in the model"));
}

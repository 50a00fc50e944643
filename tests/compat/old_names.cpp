// A program written against loom 0.1.0, as its users wrote them: a Llama from a llama_config, its
// plan typed and from a run file, read through the plan's accessors, trained with the gradient norm
// as a double. loom 0.2.0 renamed all of these (docs/changes.md) and keeps the old names, deprecated,
// for a release. check_old_names.py compiles it as a program outside the tree is compiled (pkg-config's
// flags; warnings on, not errors), requires a deprecation warning naming X on the line below each
// comment "deprecated: X", and runs it: what the old names build and return is what the new ones do.
#include <loom/loom.hpp>
// deprecated: <loom/models/causal_lm.hpp>
#include <loom/models/llama.hpp>
// deprecated: <loom/base/text.hpp>
#include <loom/runtime/text.hpp>

#include <torch/optim/sgd.h>

#include <unistd.h>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

namespace {

namespace fs = std::filesystem;

int failures = 0;

void check(bool holds, const std::string& what) {
  if (holds) return;
  std::fprintf(stderr, "old-names: %s\n", what.c_str());
  ++failures;
}

// deprecated: loom::models::causal_lm_config
loom::models::llama_config small_llama() {
  // deprecated: loom::models::causal_lm_config
  loom::models::llama_config config;
  config.vocab_size = 64;
  config.hidden_size = 32;
  config.intermediate_size = 48;
  config.num_hidden_layers = 2;
  config.num_attention_heads = 4;
  config.num_key_value_heads = 2;
  config.head_dim = 8;
  config.rope_theta = 500;
  // deprecated: loom::models::rope_parameters
  loom::models::llama3_rope_scaling scaling;
  scaling.factor = 4;
  scaling.original_max_position_embeddings = 8;
  config.rope_scaling = scaling;
  config.attention_bias = true;
  return config;
}

// The same model under 0.2.0's names.
loom::models::causal_lm_config small_causal_lm() {
  loom::models::causal_lm_config config;
  config.vocab_size = 64;
  config.hidden_size = 32;
  config.intermediate_size = 48;
  config.num_hidden_layers = 2;
  config.num_attention_heads = 4;
  config.num_key_value_heads = 2;
  config.head_dim = 8;
  config.rope = {.theta = 500,
                 .type = loom::models::rope_parameters::scaling::llama3,
                 .factor = 4,
                 .original_max_position_embeddings = 8};
  config.qkv_bias = config.output_bias = true;
  return config;
}

fs::path write_file(const fs::path& path, const std::string& text) {
  std::ofstream(path) << text;
  return path;
}

}  // namespace

int main() {
  const fs::path scratch = fs::temp_directory_path() / ("loom-old-names-" + std::to_string(getpid()));
  fs::create_directories(scratch);
  const at::Tensor ids = at::arange(2 * 12, at::kLong).remainder(64).view({2, 12});

  // The plan and its accessors.
  // deprecated: CausalLM
  const auto plan = loom::model<loom::models::Llama>(small_llama()) | loom::seeded(7) |
                    loom::lora(4, {"q_proj", "v_proj"}) | loom::local();
  // deprecated: find<loom::seeded_stage>
  check(plan.seed() == 7u, "plan.seed() is not the seeded stage's");
  // deprecated: find<loom::lora_stage>
  check(plan.lora() && plan.lora()->rank() == 4, "plan.lora() is not the lora stage");
  // deprecated: find<loom::default_dtype_stage>
  check(!plan.default_dtype(), "plan.default_dtype() of a plan without one");
  // deprecated: find<loom::mixed_precision_stage>
  check(!plan.mixed_precision(), "plan.mixed_precision() of a plan without one");
  // deprecated: find<loom::pretrained_stage>
  check(!plan.pretrained(), "plan.pretrained() of a plan without one");
  // deprecated: find<loom::recompute_stage>
  check(!plan.recompute(), "plan.recompute() of a plan without one");
  // deprecated: find<loom::trainable_stage>
  check(plan.trainable_patterns().empty(), "plan.trainable_patterns() of a plan without trainable");

  const fs::path run_file =
      write_file(scratch / "plan.json",
                 R"({"plan": [{"seeded": 3}, {"default_dtype": "bf16"}, {"lora": {"rank": 2, "targets": ["q_proj"]}},
                     {"trainable": ["lm_head"]}]})");
  // deprecated: CausalLM
  const auto from_file = loom::plan_from_file(loom::model<loom::models::Llama>(small_llama()), run_file);
  // deprecated: find<loom::seeded_stage>
  check(from_file.seed() == 3u, "a run file's plan.seed()");
  // deprecated: find<loom::default_dtype_stage>
  check(from_file.default_dtype() == loom::bf16, "a run file's plan.default_dtype()");
  // deprecated: find<loom::trainable_stage>
  check(from_file.trainable_patterns().size() == 1, "a run file's plan.trainable_patterns()");
  // deprecated: find<loom::lora_stage>
  check(from_file.lora() && from_file.lora()->rank() == 2, "a run file's plan.lora()");

  // Training, with the norm as a double.
  auto job = loom::build(plan, loom::runtime::single_process());
  torch::optim::SGD optimizer(job.trainable_parameters(), torch::optim::SGDOptions(0.1));
  double first_loss = 0;
  double last_loss = 0;
  for (int step = 0; step < 3; ++step) {
    optimizer.zero_grad();
    const at::Tensor loss = loom::models::causal_lm_loss(job.forward(ids), ids);
    job.backward(loss);
    // deprecated: at::Tensor::item<double>()
    const double norm = job.clip_grad_norm(1e9);
    check(std::isfinite(norm) && norm > 0, "the gradient norm as a double: " + std::to_string(norm));
    check(norm == job.clip_grad_norm(1e9).item<double>(), "the gradient norm as a double is not the tensor's");
    optimizer.step();
    if (step == 0) first_loss = loss.item<double>();
    last_loss = loss.item<double>();
  }
  check(last_loss < first_loss, "3 steps did not lower the loss");

  // 0.1.0's model is the one the new names build.
  // deprecated: CausalLM
  const auto old_plan = loom::model<loom::models::Llama>(small_llama()) | loom::seeded(1);
  auto old_model = loom::build(old_plan, loom::runtime::single_process());
  auto new_model = loom::build(loom::model<loom::models::CausalLM>(small_causal_lm()) | loom::seeded(1),
                               loom::runtime::single_process());
  check(old_model.forward(ids).equal(new_model.forward(ids)), "a Llama's logits are not the CausalLM's");

  // config.json, read as 0.1.0 read it.
  const std::string llama_json = R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 32,
      "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
      "rope_theta": 500.0, "attention_bias": true, "rope_scaling": {"rope_type": "llama3", "factor": 4.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8}})";
  fs::create_directories(scratch / "llama");
  write_file(scratch / "llama" / "config.json", llama_json);
  // deprecated: causal_lm_config
  const auto read = loom::models::llama_config::from_pretrained(scratch / "llama");
  check(read.rope_theta == 500 && read.rope_scaling && read.rope_scaling->factor == 4 &&
            read.rope_scaling->original_max_position_embeddings == 8 && read.attention_bias && read.head_dim == 8,
        "llama_config::from_pretrained does not read config.json's values");
  std::string refusal;
  try {
    // deprecated: causal_lm_config
    (void)loom::models::llama_config::from_json(
        R"({"architectures": ["Qwen3ForCausalLM"], "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
            "num_hidden_layers": 2, "num_attention_heads": 4})",
        "qwen3/config.json");
  } catch (const std::invalid_argument& error) {
    refusal = error.what();
  }
  check(refusal.find("'qwen3/config.json' is a Qwen3 checkpoint") != std::string::npos,
        "llama_config::from_json reads a Qwen3 config.json; it said '" + refusal + "'");

  fs::remove_all(scratch);
  if (failures == 0) std::printf("old-names: a program written against loom 0.1.0 builds and trains\n");
  return failures == 0 ? 0 : 1;
}

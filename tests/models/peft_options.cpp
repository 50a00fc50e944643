// PEFT's LoRA options in loom, for tests/models/peft_options_vs_peft.py:
//   peft-options RUN_FILE load ADAPTER IDS OUT   job.load_adapter(ADAPTER), the logits of IDS into OUT
//   peft-options RUN_FILE train OUT              three AdamW steps, each rank on ids of its own; then
//                                                OUT/adapter (save_adapter), OUT/logits.safetensors, and
//                                                OUT/merged (merge(), save_pretrained) with the merged
//                                                model's logits, OUT/merged-logits.safetensors
// The plan is the run file's (its pretrained folder's config.json gives the model, of any family).
#include <loom/config/run_file.hpp>
#include <loom/io/safetensors.hpp>
#include <loom/loom.hpp>
#include <loom/models/causal_lm.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/optim/adamw.h>
#include <torch/torch.h>

#include <exception>
#include <filesystem>
#include <string_view>
#include <variant>
#include <vector>

namespace {

namespace fs = std::filesystem;

at::Tensor logits_of(auto& job, const at::Tensor& ids) {
  torch::NoGradGuard no_grad;
  return job.forward(ids).to(at::kFloat);
}

void load(auto& job, const fs::path& adapter, const fs::path& ids_file, const fs::path& out) {
  job.load_adapter(adapter);
  const at::Tensor ids = loom::load_safetensors(ids_file).tensors.at(0).tensor;
  const at::Tensor logits = logits_of(job, ids);
  if (job.rt().rank() == 0) loom::save_safetensors(out, {{"logits", logits}});
}

void train(auto& job, const fs::path& out) {
  const std::int64_t vocab = job.module()->config.vocab_size;
  torch::optim::AdamW optimizer(job.trainable_parameters(), torch::optim::AdamWOptions(5e-2));
  for (int step = 0; step < 3; ++step) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(100 * step + job.rt().rank());
    const at::Tensor ids = torch::randint(0, vocab, {2, 12}, generator, torch::kLong);
    job.backward(loom::models::causal_lm_loss(job.forward(ids), ids));
    optimizer.step();
    job.zero_grad();
  }
  auto generator = at::make_generator<at::CPUGeneratorImpl>(7);
  const at::Tensor ids = torch::randint(0, vocab, {2, 12}, generator, torch::kLong);
  const at::Tensor logits = logits_of(job, ids);
  job.save_adapter(out / "adapter");
  if (job.rt().rank() == 0) loom::save_safetensors(out / "logits.safetensors", {{"ids", ids}, {"logits", logits}});
  // Each layer's own scale folded in, and the saved modules (a tied embedding with its head) as trained.
  job.merge();
  const at::Tensor merged = logits_of(job, ids);
  job.save_pretrained(out / "merged");
  if (job.rt().rank() == 0) loom::save_safetensors(out / "merged-logits.safetensors", {{"logits", merged}});
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string_view> words(argv + 1, argv + argc);
  const bool loads = words.size() == 5 && words[1] == "load";
  const bool trains = words.size() == 3 && words[1] == "train";
  if (!loads && !trains) {
    fmt::print(stderr, "usage: peft-options RUN_FILE load ADAPTER IDS OUT | RUN_FILE train OUT\n");
    return 2;
  }
  try {
    const loom::run_file file = loom::read_run_file(fs::path(words[0]));
    const auto pretrained = file.stages.stages.find<loom::pretrained_stage>();
    if (!pretrained) throw std::invalid_argument("the run file has no pretrained stage");
    const auto config = loom::models::causal_lm_config::from_pretrained(pretrained->path());
    const auto plan = loom::plan_from_file(loom::model<loom::models::CausalLM>(config), file);
    auto built = loom::build(plan, loom::runtime::from_env());
    std::visit(
        [&](auto& job) {
          // The plan, and the collectives a step issues: under fsdp() a saved module's shard is
          // reduce-scattered with its unit's.
          if (job.rt().rank() == 0) fmt::print("{}\n{}\n", job.describe(), job.schedule().to_string());
          if (loads) {
            load(job, fs::path(words[2]), fs::path(words[3]), fs::path(words[4]));
          } else {
            train(job, fs::path(words[2]));
          }
        },
        built);
    return 0;
  } catch (const std::exception& error) {
    fmt::print(stderr, "peft-options: {}\n", error.what());
    return 1;
  }
}

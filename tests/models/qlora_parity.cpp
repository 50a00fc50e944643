// QLoRA in loom against transformers + bitsandbytes + PEFT, for tests/models/qlora_vs_transformers.py:
//   qlora-parity FOLDER {local|ddp|fsdp|hybrid} OUT [--merge]
// builds what the benchmark builds on FOLDER (a transformers checkpoint saved in bf16):
//   model | seeded | default_dtype(bf16) | pretrained(FOLDER) | quantized(nf4) | lora(4, all linear but the
//   head, alpha 8) | mixed_precision({.param = bf16}) | strategy
// (hybrid: fsdp({.shard_group_size = 1})), and writes into OUT what the driver compares with the Python stack,
// on FOLDER/inputs.safetensors' `ids` and `batches` ([steps, rows, tokens], each rank on its rows of each):
// - base-logits.safetensors: the logits of `ids` before any adapter moves them (lora_B is zero);
// - initial-logits.safetensors: after job.load_adapter(FOLDER/initial-adapter), PEFT's initial adapter;
// - losses-<rank>.safetensors: the loss of each of `steps` SGD steps (lr FOLDER/inputs' `lr`) on this
//   rank's rows, which the driver averages over the ranks (equal token counts: the whole batch's mean);
// - logits.safetensors, adapter/: the trained logits of `ids` and job.save_adapter(...) (PEFT's folder);
// - with --merge, merged/ and merged-logits.safetensors: job.merge() then job.save_pretrained(...), the
//   base dequantized with the update added, and the merged job's logits of `ids`.
#include "named_tensor.hpp"

#include <loom/io/safetensors.hpp>
#include <loom/loom.hpp>
#include <loom/models/causal_lm.hpp>

#include <fmt/format.h>
#include <torch/optim/sgd.h>
#include <torch/torch.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <stdexcept>
#include <string_view>
#include <vector>

namespace {

using loom::testing::named;

namespace fs = std::filesystem;

struct arguments {
  fs::path folder;
  std::string_view strategy;
  fs::path out;
  bool merge = false;
};

at::Tensor logits_of(auto& job, const at::Tensor& ids) {
  const torch::NoGradGuard no_grad;
  return job.forward(ids).to(at::kFloat);
}

void write_on_rank_zero(auto& job, const fs::path& file, const at::Tensor& logits) {
  if (job.rt().rank() == 0) loom::save_safetensors(file, {{"logits", logits}});
}

template <class Plan>
void run(const Plan& plan, const arguments& args) {
  auto job = loom::build(plan, loom::runtime::from_env());
  if (job.rt().rank() == 0) fmt::print("{}\n", job.describe());
  const std::vector<loom::named_tensor> inputs = loom::load_safetensors(args.folder / "inputs.safetensors").tensors;
  const at::Tensor ids = named(inputs, "ids");
  const at::Tensor batches = named(inputs, "batches");
  const double lr = named(inputs, "lr").item<double>();
  fs::create_directories(args.out);

  write_on_rank_zero(job, args.out / "base-logits.safetensors", logits_of(job, ids));
  job.load_adapter(args.folder / "initial-adapter");
  write_on_rank_zero(job, args.out / "initial-logits.safetensors", logits_of(job, ids));

  // Each data-parallel rank on its rows of every batch; the gradients' mean over the ranks is the whole
  // batch's, as every row has as many tokens.
  const std::int64_t rows = batches.size(1) / job.data_world_size();
  torch::optim::SGD optimizer(job.trainable_parameters(), torch::optim::SGDOptions(lr));
  std::vector<double> losses;
  for (std::int64_t step = 0; step < batches.size(0); ++step) {
    const at::Tensor batch = batches[step].narrow(0, job.data_rank() * rows, rows).contiguous();
    const at::Tensor loss = loom::models::causal_lm_loss(job.forward(batch), batch);
    job.backward(loss);
    optimizer.step();
    job.zero_grad();
    losses.push_back(loss.item<double>());
  }
  loom::save_safetensors(args.out / fmt::format("losses-{}.safetensors", job.rt().rank()),
                         {{"losses", torch::tensor(losses, torch::kDouble)}});

  const at::Tensor trained = logits_of(job, ids);
  write_on_rank_zero(job, args.out / "logits.safetensors", trained);
  job.save_adapter(args.out / "adapter");
  if (args.merge) {
    job.merge();
    write_on_rank_zero(job, args.out / "merged-logits.safetensors", logits_of(job, ids));
    job.save_pretrained(args.out / "merged");
  }
}

template <class Plan>
void with_strategy(const Plan& plan, const arguments& args) {
  if (args.strategy == "local") return run(plan | loom::local(), args);
  if (args.strategy == "ddp") return run(plan | loom::ddp(), args);
  if (args.strategy == "fsdp") return run(plan | loom::fsdp(), args);
  if (args.strategy == "hybrid") return run(plan | loom::fsdp({.shard_group_size = 1}), args);
  throw std::invalid_argument(fmt::format("unknown strategy '{}': local, ddp, fsdp or hybrid", args.strategy));
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string_view> words(argv + 1, argv + argc);
  if (words.size() < 3 || words.size() > 4 || (words.size() == 4 && words[3] != "--merge")) {
    fmt::print(stderr, "usage: qlora-parity FOLDER {{local|ddp|fsdp|hybrid}} OUT [--merge]\n");
    return 2;
  }
  const arguments args{.folder = words[0], .strategy = words[1], .out = words[2], .merge = words.size() == 4};
  try {
    const auto config = loom::models::causal_lm_config::from_pretrained(args.folder);
    const auto plan =
        loom::model<loom::models::CausalLM>(config) | loom::seeded(3) | loom::default_dtype(loom::bf16) |
        loom::pretrained(args.folder.string()) | loom::quantized(loom::nf4) |
        loom::lora(4, {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}, {.alpha = 8}) |
        loom::mixed_precision({.param = loom::bf16});
    with_strategy(plan, args);
    return 0;
  } catch (const std::exception& error) {
    fmt::print(stderr, "qlora-parity: {}\n", error.what());
    return 1;
  }
}

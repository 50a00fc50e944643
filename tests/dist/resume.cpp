// Resuming from a checkpoint continues bit for bit. Usage (under loom-run):
//   dist-resume {ddp|fsdp|lora-fsdp|lora-bf16-fsdp} DIR STEPS [STOP_AFTER] [--async] [--strict]
// trains a small TinyGpt for STEPS AdamW steps with a checkpoint every 4 in DIR/checkpoints,
// resuming from the newest one; with STOP_AFTER it exits after that step's checkpoint. At the end
// each rank writes DIR/final-rank-R.safetensors: the whole model and its optimizer's state.
// --async saves on a background thread (polled every step); --strict refuses to fall back from a
// damaged checkpoint. resume_check.py compares a straight run with an interrupted and resumed one;
// checkpoint_crash.py and checkpoint_damage.py kill it in a save and damage its checkpoints.
#include "final_state.hpp"
#include "world.hpp"

#include <loom/loom.hpp>
#include <models/tiny_gpt.hpp>

#include <fmt/format.h>
#include <torch/optim/adamw.h>

#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using loom::testing::world;

constexpr models::tiny_gpt_config small{.vocab = 32, .d = 16, .layers = 3, .heads = 2, .ctx = 8};
constexpr std::int64_t every = 4;

// The batch of (step, rank), drawn on the CPU and moved to the rank's device: a resumed run sees the
// batches a straight one would.
std::pair<at::Tensor, at::Tensor> batch(std::int64_t step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 * static_cast<std::uint64_t>(step) +
                                                      static_cast<std::uint64_t>(world().rank()));
  at::Tensor x = torch::randint(0, small.vocab, {2, small.ctx}, gen);
  at::Tensor y = torch::randint(0, small.vocab, {2, small.ctx}, gen);
  return {x.to(world().device()), y.to(world().device())};
}

struct run_options {
  fs::path dir;
  std::int64_t steps = 0;
  std::int64_t stop_after = -1;
  bool async_save = false;
  bool strict = false;
};

template <class Plan>
int run(const Plan& plan, const run_options& options) {
  const auto& [dir, steps, stop_after, async_save, strict] = options;
  // LibTorch seeds its default generator at random: a straight run is reproducible only when seeded.
  // (The checkpoint carries the generator's state, so the dropout of a resumed run continues the
  // stream of the run it resumes either way.)
  torch::manual_seed(100 + static_cast<std::uint64_t>(world().rank()));
  auto job = loom::build(plan, world());
  torch::optim::AdamW optimizer(job.trainable_parameters(), torch::optim::AdamWOptions(1e-2));
  loom::checkpointer checkpoints(world(), {.folder = dir / "checkpoints", .strict = strict, .async_save = async_save});
  std::int64_t first = 1;
  if (const auto resumed = checkpoints.resume(job, optimizer)) {
    first = resumed->step + 1;
    if (world().rank() == 0) std::cout << "resumed from step " << resumed->step << std::endl;
  }
  for (std::int64_t step = first; step <= steps; ++step) {
    const auto [x, y] = batch(step);
    job.backward(job.forward(x, y));
    optimizer.step();
    job.zero_grad();
    checkpoints.poll();
    if (step % every == 0) checkpoints.save(job, optimizer, step, fmt::format(R"({{"next_step": {}}})", step + 1));
    if (step == stop_after) break;
  }
  checkpoints.wait();
  if (first <= stop_after && stop_after <= steps) return 0;
  loom::testing::save_final_state(job, optimizer, dir / fmt::format("final-rank-{}.safetensors", world().rank()));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> positional;
  run_options options;
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word == "--async") {
      options.async_save = true;
    } else if (word == "--strict") {
      options.strict = true;
    } else {
      positional.push_back(word);
    }
  }
  if (positional.size() != 3 && positional.size() != 4) {
    std::cerr << "usage: dist-resume {ddp|fsdp|lora-fsdp|lora-bf16-fsdp} DIR STEPS [STOP_AFTER] [--async] "
                 "[--strict]\n";
    return 2;
  }
  const std::string& strategy = positional[0];
  options.dir = positional[1];
  options.steps = std::stoll(positional[2]);
  if (positional.size() == 4) options.stop_after = std::stoll(positional[3]);
  const auto model = loom::model<models::TinyGpt>(small) | loom::seeded(5);
  try {
    if (strategy == "ddp") return run(model | loom::ddp(), options);
    if (strategy == "fsdp") return run(model | loom::fsdp(), options);
    if (strategy == "lora-fsdp") {
      return run(model | loom::lora(4, {"q_proj", "v_proj"}, {.dropout = 0.1}) | loom::fsdp(), options);
    }
    if (strategy == "lora-bf16-fsdp") {
      // A frozen bf16 base, fp32 adapters, bf16 compute: the checkpoint holds each in its own dtype.
      return run(model | loom::default_dtype(loom::bf16) | loom::lora(4, {"q_proj", "v_proj"}, {.dropout = 0.1}) |
                     loom::mixed_precision() | loom::fsdp(),
                 options);
    }
  } catch (const std::exception& error) {
    std::cerr << error.what() << '\n';
    return 1;
  }
  std::cerr << "unknown strategy " << strategy << '\n';
  return 2;
}

// loom::train reading a text dataset (JSON Lines, tokenized as read, packed, shared out by rank,
// read ahead on a thread), its position each rank's part of the checkpoints. Usage (under loom-run):
//   dist-data-resume {ddp|fsdp} DATA_DIR OUT_DIR STEPS
// trains a small TinyGpt on DATA_DIR's *.jsonl with a tokenizer whose tokens are bytes, 2 micro-batches
// of 2 sequences a step, a checkpoint every 3 steps in OUT_DIR/run, resuming from the newest one.
// Every micro-batch's token ids are appended to OUT_DIR/batches-rank-R.txt ("step micro id id ...")
// as they are drawn, by every attempt; at the end each rank writes OUT_DIR/final-rank-R.safetensors
// (the model, whole, and its optimizer's state). Exits 75 when preempted. data_resume_check.py
// compares the batches and the final state of interrupted runs with an uninterrupted one's.
#include "../data/byte_tokenizer.hpp"
#include "final_state.hpp"
#include "world.hpp"

#include <loom/data/read_ahead.hpp>
#include <loom/data/text_dataset.hpp>
#include <loom/data/tokenizer.hpp>
#include <loom/loom.hpp>
#include <models/tiny_gpt.hpp>

#include <fmt/format.h>
#include <torch/optim/adamw.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using loom::testing::byte_tokenizer;
using loom::testing::world;

// The vocabulary of byte_tokenizer: <unk>, </s> and the 256 bytes.
constexpr models::tiny_gpt_config small{.vocab = 258, .d = 16, .layers = 2, .heads = 2, .ctx = 12};
constexpr std::int64_t sequences_per_micro_batch = 2;

template <class Plan>
int run(const Plan& plan, const fs::path& data, const fs::path& out, std::int64_t steps) {
  const int rank = world().rank();
  const loom::data::tokenizer tokenizer = byte_tokenizer(out / fmt::format("tokenizer-rank-{}", rank));
  // A sequence of ctx + 1 tokens is the input and, shifted by one, its targets.
  loom::data::read_ahead reader(loom::data::text_dataset(
      tokenizer,
      {.paths = {data}, .seq_len = small.ctx + 1, .seed = 7, .rank = rank, .world_size = world().world_size()}));
  std::ofstream batches(out / fmt::format("batches-rank-{}.txt", rank), std::ios::app);

  auto job = loom::build(plan, world());
  torch::optim::AdamW optimizer(job.trainable_parameters(), torch::optim::AdamWOptions(1e-2));
  const loom::train_result result =
      loom::train(job, optimizer,
                  {.loss =
                       [&](std::int64_t step, int micro) {
                         at::Tensor ids = at::empty({sequences_per_micro_batch, small.ctx + 1}, at::kLong);
                         batches << step << ' ' << micro;
                         for (std::int64_t row = 0; row < sequences_per_micro_batch; ++row) {
                           const std::vector<std::int32_t> sequence = reader.next();
                           for (std::size_t i = 0; i < sequence.size(); ++i) {
                             ids[row][static_cast<std::int64_t>(i)] = sequence[i];
                             batches << ' ' << sequence[i];
                           }
                         }
                         batches << std::endl;
                         const at::Tensor x = ids.narrow(1, 0, small.ctx).contiguous(),
                                          y = ids.narrow(1, 1, small.ctx).contiguous();
                         return job.forward(x.to(world().device()), y.to(world().device()));
                       },
                   .data_state = [&] { return reader.state(); },
                   .restore_data = [&](const std::string& state) { reader.restore(state); }},
                  {.steps = steps, .accumulate = 2, .out = out / "run", .checkpoint_every = 3, .log_every = 3});
  if (result.outcome == loom::train_outcome::preempted) return loom::resumable_exit_code;

  loom::testing::save_final_state(job, optimizer, out / fmt::format("final-rank-{}.safetensors", rank));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: dist-data-resume {ddp|fsdp} DATA_DIR OUT_DIR STEPS\n";
    return 2;
  }
  const std::string strategy = argv[1];
  const fs::path data = argv[2], out = argv[3];
  const std::int64_t steps = std::stoll(argv[4]);
  const auto model = loom::model<models::TinyGpt>(small) | loom::seeded(3);
  try {
    if (strategy == "ddp") return run(model | loom::ddp(), data, out, steps);
    if (strategy == "fsdp") return run(model | loom::fsdp(), data, out, steps);
  } catch (const std::exception& error) {
    std::cerr << error.what() << '\n';
    return 1;
  }
  std::cerr << "unknown strategy " << strategy << '\n';
  return 2;
}

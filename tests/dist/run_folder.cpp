// A run folder and what its checkpoints were trained over, under loom::train. Usage:
//   dist-run-folder base SEED FOLDER
// writes a small TinyGpt built from SEED into FOLDER (model.safetensors), one process;
//   dist-run-folder train {ddp|fsdp} BASE DATA_DIR OUT STEPS [resume-over-changes]   (under loom-run)
// adapts BASE with LoRA on DATA_DIR's *.jsonl (a tokenizer whose tokens are bytes), a checkpoint
// every 2 steps in OUT, resuming from the newest one; the dataset's identity is loom::train's
// data_identity. Exits 75 when preempted, 1 with the error on stderr. run_folder_check.py drives it.
#include "../data/byte_tokenizer.hpp"
#include "world.hpp"

#include <loom/data/read_ahead.hpp>
#include <loom/data/text_dataset.hpp>
#include <loom/io/weights.hpp>
#include <loom/loom.hpp>
#include <models/tiny_gpt.hpp>

#include <fmt/format.h>
#include <torch/optim/adamw.h>

#include <cstdint>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using loom::testing::byte_tokenizer;
using loom::testing::world;

// The vocabulary of byte_tokenizer: <unk>, </s> and the 256 bytes.
constexpr models::tiny_gpt_config small{.vocab = 258, .d = 16, .layers = 2, .heads = 2, .ctx = 12};

int write_base(std::uint64_t seed, const fs::path& folder) {
  auto job = loom::build(loom::model<models::TinyGpt>(small) | loom::seeded(seed) | loom::local(),
                         loom::runtime::single_process());
  loom::save_weights(folder, job.state_dict());
  return 0;
}

template <class Strategy>
int train(Strategy strategy, const fs::path& base, const fs::path& data, const fs::path& out, std::int64_t steps,
          bool resume_over_changes) {
  const int rank = world().rank();
  const loom::data::tokenizer tokenizer = byte_tokenizer(out.parent_path() / fmt::format("tokenizer-rank-{}", rank));
  loom::data::read_ahead reader(loom::data::text_dataset(
      tokenizer,
      {.paths = {data}, .seq_len = small.ctx + 1, .seed = 7, .rank = rank, .world_size = world().world_size()}));
  auto job = loom::build(loom::model<models::TinyGpt>(small) | loom::seeded(3) | loom::pretrained(base.string()) |
                             loom::lora(4, {"q_proj", "v_proj"}) | strategy,
                         world());
  torch::optim::AdamW optimizer(job.trainable_parameters(), torch::optim::AdamWOptions(1e-2));
  const loom::train_result result = loom::train(
      job, optimizer,
      {.loss =
           [&](std::int64_t, int) {
             const std::vector<std::int32_t> sequence = reader.next();
             at::Tensor ids = at::tensor(std::vector<std::int64_t>(sequence.begin(), sequence.end())).unsqueeze(0);
             return job.forward(ids.narrow(1, 0, small.ctx).contiguous().to(world().device()),
                                ids.narrow(1, 1, small.ctx).contiguous().to(world().device()));
           },
       .data_state = [&] { return reader.state(); },
       .restore_data = [&](const std::string& state) { reader.restore(state); }},
      {.steps = steps,
       .out = out,
       .checkpoint_every = 2,
       .log_every = 100,
       .resume_over_changes = resume_over_changes,
       .data_identity = reader.identity()});
  return result.outcome == loom::train_outcome::preempted ? loom::resumable_exit_code : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (args.size() == 3 && args[0] == "base") return write_base(std::stoull(args[1]), args[2]);
    if ((args.size() == 6 || (args.size() == 7 && args[6] == "resume-over-changes")) && args[0] == "train") {
      const bool over = args.size() == 7;
      const std::int64_t steps = std::stoll(args[5]);
      if (args[1] == "ddp") return train(loom::ddp(), args[2], args[3], args[4], steps, over);
      if (args[1] == "fsdp") return train(loom::fsdp(), args[2], args[3], args[4], steps, over);
    }
  } catch (const std::exception& error) {
    std::cerr << error.what() << '\n';
    return 1;
  }
  std::cerr << "usage: dist-run-folder base SEED FOLDER | train {ddp|fsdp} BASE DATA_DIR OUT STEPS "
               "[resume-over-changes]\n";
  return 2;
}

// A checkpoint saved under tensor_parallel(k) × data-parallel ranks resumes in another layout: other
// k, other world size, with and without the split. Usage (under loom-run):
//   dist-tensor-parallel-reshard STRATEGY:K save DIR          3 AdamW steps, a checkpoint at step 3
//   dist-tensor-parallel-reshard STRATEGY:K continue DIR OUT  resumes, writes the whole model to
//                                                             OUT.loaded, 2 more steps, then to OUT
// STRATEGY: ddp, fsdp or lora-fsdp; K: tensor_parallel's size (1 splits nothing). Each step's global
// batch is the same in every layout, split evenly across the data-parallel ranks (a tensor group
// reads one part), so runs that continue in different layouts must agree (reshard_check.py
// --tensor-parallel compares them).
#include "small_models.hpp"
#include "world.hpp"

#include <loom/loom.hpp>
#include <loom/models/causal_lm.hpp>

#include <torch/optim/adamw.h>

#include <filesystem>
#include <iostream>
#include <string>

namespace {

namespace fs = std::filesystem;
using loom::testing::split_llama;
using loom::testing::world;

constexpr std::int64_t global_rows = 12;  // 1, 2 and 4 data-parallel ranks divide it

at::Tensor my_rows(std::int64_t step, int tensor_parallel) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(700 + static_cast<std::uint64_t>(step));
  const at::Tensor ids = torch::randint(0, 64, {global_rows, 9}, gen);
  const std::int64_t per_rank = global_rows / (world().world_size() / tensor_parallel);
  return ids.narrow(0, world().rank() / tensor_parallel * per_rank, per_rank);
}

template <class Job>
void save_whole(Job& job, const fs::path& file) {
  const loom::tensor_state whole = job.state_dict();
  if (world().rank() == 0) loom::save_safetensors(file, whole);
}

template <class Plan>
int run(const Plan& plan, int tensor_parallel, const std::string& mode, const fs::path& dir, const fs::path& out) {
  auto job = loom::build(plan, world());
  torch::optim::AdamW optimizer(job.trainable_parameters(), torch::optim::AdamWOptions(1e-2));
  loom::checkpointer checkpoints(world(), {.folder = dir});
  std::int64_t first = 1, last = 3;
  if (mode == "continue") {
    const auto resumed = checkpoints.resume(job, optimizer);
    if (!resumed || resumed->step != 3) throw std::runtime_error("no checkpoint of step 3 to continue from");
    save_whole(job, fs::path(out.string() + ".loaded"));
    first = 4;
    last = 5;
  }
  for (std::int64_t step = first; step <= last; ++step) {
    const at::Tensor ids = my_rows(step, tensor_parallel);
    job.backward(job.forward(ids, ids));
    (void)job.clip_grad_norm(0.5);
    optimizer.step();
    optimizer.zero_grad();
  }
  if (mode == "save") checkpoints.save(job, optimizer, last);
  if (mode == "continue") save_whole(job, out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4 || argc > 5) {
    std::cerr << "usage: dist-tensor-parallel-reshard {ddp|fsdp|lora-fsdp}:K {save DIR | continue DIR OUT}\n";
    return 2;
  }
  const std::string asked = argv[1], mode = argv[2];
  const std::size_t colon = asked.find(':');
  const std::string strategy = asked.substr(0, colon);
  const int k = colon == std::string::npos ? 1 : std::stoi(asked.substr(colon + 1));
  const fs::path dir = argv[3], out = argc == 5 ? argv[4] : "";
  const auto model = loom::model<loom::models::CausalLM>(split_llama(4)) | loom::seeded(9);
  const auto split = loom::tensor_parallel_stage::checked({.size = static_cast<std::size_t>(k)});
  try {
    if (strategy == "ddp") return run(model | split | loom::ddp(), k, mode, dir, out);
    if (strategy == "fsdp") return run(model | split | loom::fsdp(), k, mode, dir, out);
    return run(model | loom::lora(4, {"q_proj", "o_proj", "up_proj", "down_proj"}) | split | loom::fsdp(), k, mode, dir,
               out);
  } catch (const std::exception& error) {
    std::cerr << error.what() << '\n';
    return 1;
  }
}

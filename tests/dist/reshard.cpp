// A checkpoint saved over N ranks under fsdp() resumes over M, and in another layout of hybrid
// sharding. Usage (under loom-run):
//   dist-reshard STRATEGY save DIR             3 AdamW steps, a checkpoint at step 3
//   dist-reshard STRATEGY continue DIR OUT     resumes, 2 more steps, rank 0 writes the whole model
//                                              to OUT (safetensors)
// STRATEGY: fsdp or lora-fsdp, with :S for hybrid sharding in groups of S ranks (fsdp:2).
// Each step's global batch is the same at any world size, split evenly across the ranks, so runs
// that continue over different numbers of ranks must agree (reshard_check.py compares them).
#include "world.hpp"

#include <loom/loom.hpp>
#include <loom/runtime/mesh.hpp>
#include <models/tiny_gpt.hpp>

#include <torch/optim/adamw.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <string>

namespace {

namespace fs = std::filesystem;
using loom::testing::world;

// Sizes that 2 and 3 ranks do not divide evenly: rows of 17, 20 and 80, a 68-row fc_in.
constexpr models::tiny_gpt_config small{.vocab = 17, .d = 20, .layers = 2, .heads = 2, .ctx = 8};
constexpr std::int64_t global_rows = 12;  // 1, 2, 3, 4 and 6 ranks divide it

std::pair<at::Tensor, at::Tensor> my_rows(std::int64_t step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(500 + static_cast<std::uint64_t>(step));
  const at::Tensor x = torch::randint(0, small.vocab, {global_rows, small.ctx}, gen);
  const std::int64_t per_rank = global_rows / world().world_size();
  return {x.narrow(0, world().rank() * per_rank, per_rank),
          x.narrow(0, world().rank() * per_rank, per_rank).roll(-1, 1)};
}

// The whole model and AdamW's moments and steps, whole (gathered from the shards), written by rank 0.
template <class Job>
void save_whole(Job& job, torch::optim::Optimizer& optimizer, const fs::path& file) {
  loom::tensor_state whole = job.state_dict();
  const std::vector<std::string> names = job.trainable_names();
  const std::vector<at::Tensor> mine = job.trainable_parameters();
  // The shards of one whole copy are its shard group's (every rank's without hybrid sharding).
  const loom::rank_mesh mesh(world(), job.shard_group_size());
  std::map<std::string, at::Tensor> full_shapes;
  for (const auto& item : job.module().named_parameters()) full_shapes.emplace(item.key(), item.value());
  for (std::size_t j = 0; j < mine.size(); ++j) {
    const auto& adamw =
        static_cast<const torch::optim::AdamWParamState&>(*optimizer.state().at(mine[j].unsafeGetTensorImpl()));
    const at::Tensor& full = full_shapes.at(names[j]);
    for (const auto& [field, shard] : {std::pair{"exp_avg", adamw.exp_avg()}, {"exp_avg_sq", adamw.exp_avg_sq()}}) {
      at::Tensor gathered = shard;
      if (shard.numel() != full.numel()) {
        gathered = at::empty({mesh.shard_size() * shard.numel()}, shard.options());
        mesh.shard().all_gather(shard.reshape(-1), gathered).wait();
      }
      whole.push_back({std::string(field) + "/" + names[j], gathered.reshape(-1).narrow(0, 0, full.numel())});
    }
    whole.push_back({"step/" + names[j], at::full({1}, adamw.step(), at::kDouble)});
  }
  if (world().rank() == 0) loom::save_safetensors(file, whole);
}

template <class Plan>
int run(const Plan& plan, const std::string& mode, const fs::path& dir, const fs::path& out) {
  auto job = loom::build(plan, world());
  torch::optim::AdamW optimizer(job.trainable_parameters(), torch::optim::AdamWOptions(1e-2));
  loom::checkpointer checkpoints(world(), {.folder = dir});
  std::int64_t first = 1, last = 3;
  if (mode == "continue") {
    const auto resumed = checkpoints.resume(job, optimizer);
    if (!resumed || resumed->step != 3) throw std::runtime_error("no checkpoint of step 3 to continue from");
    save_whole(job, optimizer, fs::path(out.string() + ".loaded"));
    first = 4;
    last = 5;
  }
  for (std::int64_t step = first; step <= last; ++step) {
    const auto [x, y] = my_rows(step);
    job.backward(job.forward(x, y));
    optimizer.step();
    job.zero_grad();
  }
  if (mode == "save") checkpoints.save(job, optimizer, last);
  if (mode == "continue") save_whole(job, optimizer, out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4 || argc > 5) {
    std::cerr << "usage: dist-reshard {fsdp|lora-fsdp}[:S] {save DIR | continue DIR OUT}\n";
    return 2;
  }
  const std::string asked = argv[1], mode = argv[2];
  const std::size_t colon = asked.find(':');
  const std::string strategy = asked.substr(0, colon);
  const loom::fsdp_options layout{.shard_group_size =
                                      colon == std::string::npos ? 0 : std::stoll(asked.substr(colon + 1))};
  const fs::path dir = argv[3], out = argc == 5 ? argv[4] : "";
  const auto model = loom::model<models::TinyGpt>(small) | loom::seeded(9);
  try {
    if (strategy == "fsdp") return run(model | loom::fsdp(layout), mode, dir, out);
    return run(model | loom::lora(4, {"q_proj", "fc_in"}) | loom::fsdp(layout), mode, dir, out);
  } catch (const std::exception& error) {
    std::cerr << error.what() << '\n';
    return 1;
  }
}

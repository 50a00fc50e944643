// loom's side of tests/dist/ddp_vs_pytorch.py: ddp({.find_unused_parameters = true}) on a
// gated_stack whose blocks skip their gate on the (step, rank) pairs the driver names, trained with
// AdamW. Rank 0 writes the initial parameters (the Python reference starts from them); every rank
// writes its final ones. Usage (under loom-run):
//
//   dist-unused-parity mode=full|lora steps=N width=W depth=D rows=R lr=LR skips=S out=DIR
//
// S lists "step:rank:block" triples separated by commas, rank being an index or '*' (every rank).
#include "gated_stack.hpp"
#include "key_value_arguments.hpp"
#include "world.hpp"

#include <loom/loom.hpp>

#include <torch/optim/adamw.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>

using loom::testing::gated_stack;
using loom::testing::world;

namespace {

struct skip {
  int step;
  int rank;  // -1: every rank
  std::size_t block;
};

std::vector<skip> parse_skips(const std::string& text) {
  std::vector<skip> skips;
  std::istringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    std::istringstream fields(item);
    std::string step, rank, block;
    std::getline(fields, step, ':');
    std::getline(fields, rank, ':');
    std::getline(fields, block);
    skips.push_back({std::stoi(step), rank == "*" ? -1 : std::stoi(rank), std::stoul(block)});
  }
  return skips;
}

std::vector<bool> gates_used(const std::vector<skip>& skips, int step, std::size_t depth) {
  std::vector<bool> used(depth, true);
  for (const skip& s : skips) {
    if (s.step == step && (s.rank == -1 || s.rank == world().rank())) used.at(s.block) = false;
  }
  return used;
}

void write_parameters(torch::nn::Module& module, const std::filesystem::path& folder) {
  std::filesystem::create_directories(folder);
  for (const auto& item : module.named_parameters()) {
    const at::Tensor values = item.value().detach().contiguous();
    std::ofstream(folder / (item.key() + ".f32"), std::ios::binary)
        .write(static_cast<const char*>(values.data_ptr()), static_cast<std::streamsize>(values.nbytes()));
  }
}

template <class Plan>
void train(const Plan& plan, const std::map<std::string, std::string>& arguments) {
  const std::filesystem::path out = arguments.at("out");
  const int steps = std::stoi(arguments.at("steps"));
  const std::int64_t width = std::stol(arguments.at("width"));
  const std::int64_t rows = std::stol(arguments.at("rows"));
  const auto depth = static_cast<std::size_t>(std::stoul(arguments.at("depth")));
  const auto skips = parse_skips(arguments.at("skips"));

  auto job = loom::build(plan, world());
  if (world().rank() == 0) write_parameters(job.module(), out / "init");
  torch::optim::AdamW optimizer(job.trainable_parameters(), torch::optim::AdamWOptions(std::stod(arguments.at("lr"))));
  for (int step = 0; step < steps; ++step) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(100 + step);
    const std::int64_t all_rows = rows * world().world_size();
    at::Tensor x = torch::randn({all_rows, width}, generator).narrow(0, world().rank() * rows, rows);
    at::Tensor y = torch::randn({all_rows, width}, generator).narrow(0, world().rank() * rows, rows);
    at::Tensor loss = torch::mse_loss(job.forward(x, gates_used(skips, step, depth)), y);
    job.backward(loss);
    optimizer.step();
    job.zero_grad();
  }
  write_parameters(job.module(), out / "loom" / ("rank" + std::to_string(world().rank())));
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const auto arguments = loom::testing::key_value_arguments(argc, argv);
    const std::int64_t width = std::stol(arguments.at("width"));
    const std::int64_t depth = std::stol(arguments.at("depth"));
    const auto model = loom::model<gated_stack>(width, depth) | loom::seeded(11);
    const auto strategy = loom::ddp({.find_unused_parameters = true});
    if (arguments.at("mode") == "lora") {
      train(model | loom::lora(4, {"up", "gate"}) | strategy, arguments);
    } else {
      train(model | strategy, arguments);
    }
  } catch (const std::exception& error) {
    std::cerr << error.what() << '\n';
    return 1;
  }
  return 0;
}

// loom's side of tests/dist/precision_vs_pytorch.py: a TinyGpt trained with AdamW under fsdp() or
// ddp(), in bf16 over fp32 master weights (precision=bf16), or with a cast left out: fp32 (no
// mixed_precision stage) or bf16-reduce (gradients averaged in bf16). With lora=1 the frozen base
// is built in bf16 (in fp32 for precision=fp32) and the adapters train. Usage (under loom-run):
//
//   dist-precision-parity strategy=fsdp|ddp lora=0|1 precision=bf16|fp32|bf16-reduce steps=N out=DIR
//                         [init=FILE]
//
// Rank 0 writes DIR/init.safetensors, the state training starts from; every rank writes
// DIR/rank-R.safetensors: the final state_dict and "loss", each step's loss on that rank. With
// init=FILE it starts from that file's weights, each converted to the dtype this plan holds it in:
// a run with an fp32 base then starts from the very values of a bf16 one, so only the arithmetic
// differs.
#include "key_value_arguments.hpp"
#include "world.hpp"

#include <loom/loom.hpp>
#include <models/tiny_gpt.hpp>

#include <fmt/format.h>
#include <torch/optim/adamw.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

using loom::testing::world;
using arguments_map = std::map<std::string, std::string>;

constexpr models::tiny_gpt_config config{.vocab = 32, .d = 32, .layers = 2, .heads = 2, .ctx = 16};
constexpr std::int64_t rows = 4;

// The batch of (step, rank), drawn as the reference draws it with torch.Generator().manual_seed.
std::pair<at::Tensor, at::Tensor> batch(int step) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1000 * static_cast<std::uint64_t>(step) +
                                                            static_cast<std::uint64_t>(world().rank()));
  at::Tensor ids = torch::randint(0, config.vocab, {rows, config.ctx}, generator);
  at::Tensor targets = torch::randint(0, config.vocab, {rows, config.ctx}, generator);
  return {ids, targets};
}

// `weights` by the names of `like`, each in the dtype `like` holds it in.
loom::tensor_state converted_like(const std::vector<loom::named_tensor>& weights, const loom::tensor_state& like) {
  std::map<std::string, at::Tensor> by_name;
  for (const loom::named_tensor& w : weights) by_name.emplace(w.name, w.tensor);
  loom::tensor_state converted;
  for (const loom::named_tensor& t : like) {
    const auto found = by_name.find(t.name);
    if (found == by_name.end()) throw std::invalid_argument("init has no tensor " + t.name);
    converted.push_back({t.name, found->second.to(t.tensor.scalar_type())});
  }
  return converted;
}

template <class Plan>
void train(const Plan& plan, const arguments_map& arguments) {
  const std::filesystem::path out = arguments.at("out");
  const int steps = std::stoi(arguments.at("steps"));
  std::filesystem::create_directories(out);
  auto job = loom::build(plan, world());
  if (const auto init = arguments.find("init"); init != arguments.end()) {
    job.load_state_dict(converted_like(loom::load_safetensors(init->second).tensors, job.state_dict()));
  }
  // On every rank: under fsdp() the whole state is gathered from the shards.
  const loom::tensor_state initial = job.state_dict();
  if (world().rank() == 0) loom::save_safetensors(out / "init.safetensors", initial);
  torch::optim::AdamW optimizer(job.trainable_parameters(), torch::optim::AdamWOptions(1e-2));
  std::vector<float> losses;
  for (int step = 0; step < steps; ++step) {
    const auto [ids, targets] = batch(step);
    at::Tensor loss = job.forward(ids, targets);
    losses.push_back(loss.item<float>());
    job.backward(loss);
    optimizer.step();
    job.zero_grad();
  }
  loom::tensor_state final_state = job.state_dict();
  final_state.push_back({"loss", torch::tensor(losses)});
  loom::save_safetensors(out / fmt::format("rank-{}.safetensors", world().rank()), final_state);
}

template <class Model, class Strategy>
void train_in(const Model& model, const Strategy& strategy, const arguments_map& arguments) {
  const std::string& precision = arguments.at("precision");
  if (precision == "fp32") return train(model | strategy, arguments);
  if (precision != "bf16" && precision != "bf16-reduce") throw std::invalid_argument("unknown precision " + precision);
  const loom::dtype reduce = precision == "bf16-reduce" ? loom::bf16 : loom::fp32;
  train(model | loom::mixed_precision_stage::checked({.reduce = reduce}) | strategy, arguments);
}

template <class Strategy>
void train_with(const Strategy& strategy, const arguments_map& arguments) {
  const auto model = loom::model<models::TinyGpt>(config) | loom::seeded(1);
  if (arguments.at("lora") == "0") return train_in(model, strategy, arguments);
  // default_dtype(fp32) builds as a plan without the stage does: one plan type for both.
  const loom::dtype base = arguments.at("precision") == "fp32" ? loom::fp32 : loom::bf16;
  train_in(model | loom::default_dtype_stage::checked(base) | loom::lora(4, {"q_proj", "k_proj", "v_proj", "o_proj"}),
           strategy, arguments);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const auto arguments = loom::testing::key_value_arguments(argc, argv);
    const std::string& strategy = arguments.at("strategy");
    if (strategy == "fsdp") {
      train_with(loom::fsdp(), arguments);
    } else if (strategy == "ddp") {
      train_with(loom::ddp(), arguments);
    } else {
      throw std::invalid_argument("unknown strategy " + strategy);
    }
  } catch (const std::exception& error) {
    std::cerr << error.what() << '\n';
    return 1;
  }
  return 0;
}

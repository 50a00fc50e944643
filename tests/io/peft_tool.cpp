// The C++ side of peft_interop.py, on a small TinyGpt (`small` below, mirrored there). Usage:
//   peft-tool train DIR  trains lora(4, {"q_proj", "v_proj"}, {.alpha = 6.5}) for a few AdamW steps,
//                        then writes DIR/adapter (PEFT), DIR/base (the base weights), and
//                        DIR/logits.safetensors ("input" tokens and the model's "logits" for them)
//   peft-tool check DIR  loads DIR/base and DIR/adapter (written by PEFT) into a fresh plan and
//                        compares its logits for DIR/logits.safetensors' input with the ones there
#include <loom/io/safetensors.hpp>
#include <loom/loom.hpp>
#include <models/tiny_gpt.hpp>

#include <torch/optim/adamw.h>

#include <filesystem>
#include <iostream>
#include <string>

namespace {

namespace fs = std::filesystem;

const models::tiny_gpt_config small{.vocab = 32, .d = 32, .layers = 2, .heads = 2, .ctx = 16};

// What a model computes on its sampled tokens, with nothing random left.
struct TinyGpt : models::TinyGpt {
  TinyGpt() : models::TinyGpt(small) {}
  at::Tensor forward(const at::Tensor& idx) { return logits(idx); }
};

auto plan(std::uint64_t seed) {
  return loom::model<TinyGpt>() | loom::seeded(seed) | loom::lora(4, {"q_proj", "v_proj"}, {.alpha = 6.5});
}

at::Tensor tokens(std::uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return torch::randint(0, small.vocab, {3, small.ctx}, gen, torch::kLong);
}

int train(const fs::path& dir) {
  auto job = loom::build(plan(1), loom::runtime::single_process());
  torch::optim::AdamW optimizer(job.trainable_parameters(), torch::optim::AdamWOptions(1e-2));
  for (std::uint64_t step = 0; step < 4; ++step) {
    const at::Tensor idx = tokens(10 + step);
    const at::Tensor logits = job.forward(idx);
    job.backward(torch::nn::functional::cross_entropy(logits.view({-1, small.vocab}), idx.roll(-1, 1).view(-1)));
    optimizer.step();
    job.zero_grad();
  }
  job.save_adapter(dir / "adapter");
  job.save_weights(dir / "base");
  torch::NoGradGuard no_grad;
  const at::Tensor input = tokens(99);
  loom::save_safetensors(dir / "logits.safetensors", {{"input", input}, {"logits", job.forward(input)}});
  return 0;
}

int check(const fs::path& dir) {
  auto job = loom::build(plan(2), loom::runtime::single_process());  // another seed: everything must load
  (void)job.load_weights(dir / "base");
  job.load_adapter(dir / "adapter");
  const loom::safetensors_content expected = loom::load_safetensors(dir / "logits.safetensors");
  torch::NoGradGuard no_grad;
  const at::Tensor logits = job.forward(expected.tensors.at(0).tensor);
  const double difference = (logits - expected.tensors.at(1).tensor).abs().max().item<double>();
  std::cout << "largest |loom - PEFT| logit difference: " << difference << '\n';
  return difference <= 1e-5 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string usage = "usage: peft-tool {train|check} DIR\n";
  if (argc != 3) {
    std::cerr << usage;
    return 2;
  }
  const std::string mode = argv[1];
  try {
    if (mode == "train") return train(argv[2]);
    if (mode == "check") return check(argv[2]);
  } catch (const std::exception& error) {
    std::cerr << error.what() << '\n';
    return 1;
  }
  std::cerr << usage;
  return 2;
}

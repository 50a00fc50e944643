// A recipe outside loom's tree, built with nothing but `pkg-config --cflags --libs loom` and
// <loom/loom.hpp>: a model of loom's layers, a plan, a build and one training step.
#include <loom/loom.hpp>

#include <torch/nn/module.h>
#include <torch/optim/sgd.h>

#include <iostream>

struct BigramImpl : torch::nn::Module {
  BigramImpl()
      : embed(register_module("embed", loom::nn::Embedding(16, 8))),
        head(register_module("head", loom::nn::Linear(8, 16))) {}
  at::Tensor forward(const at::Tensor& tokens) {
    const at::Tensor logits = head(embed(tokens.narrow(1, 0, tokens.size(1) - 1)));
    return at::cross_entropy_loss(logits.flatten(0, 1), tokens.narrow(1, 1, tokens.size(1) - 1).flatten());
  }
  loom::nn::Embedding embed;
  loom::nn::Linear head;
};
TORCH_MODULE(Bigram);

int main() {
  auto job = loom::build(loom::model<Bigram>() | loom::seeded(1) | loom::local(), loom::runtime::single_process());
  torch::optim::SGD optimizer(job.trainable_parameters(), torch::optim::SGDOptions(0.1));
  const at::Tensor tokens = at::arange(32, at::kLong).remainder(16).view({2, 16});
  const double first = job.forward(tokens).item<double>();
  for (int step = 0; step < 20; ++step) {
    optimizer.zero_grad();
    job.forward(tokens).backward();
    optimizer.step();
  }
  const double last = job.forward(tokens).item<double>();
  std::cout << "consumer: loss " << first << " -> " << last << '\n';
  return last < first ? 0 : 1;
}

// expect: loom R7: model<M>\(\.\.\.\) needs a LibTorch module
// A class that is not a LibTorch module reaches build(): checked where the plan meets LibTorch.
#include <loom/loom.hpp>

#include <string>

struct Net : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x) { return x; }
};

void build_it() {
#ifdef LOOM_CF_PASS
  auto job = loom::build(loom::model<Net>(), loom::runtime::single_process());
#else
  auto job = loom::build(loom::model<std::string>(), loom::runtime::single_process());
#endif
  (void)job;
}

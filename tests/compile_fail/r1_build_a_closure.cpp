// expect: loom R1: the plan has no model
// build() given a partial pipeline: it has no model yet.
#include <loom/loom.hpp>

struct Net : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x) { return x; }
};

void build_it() {
  constexpr auto adapters = loom::lora(8) | loom::ddp();
#ifdef LOOM_CF_PASS
  auto job = loom::build(loom::model<Net>() | adapters, loom::runtime::single_process());
  (void)job;
#else
  loom::build(adapters, loom::runtime::single_process());
#endif
}

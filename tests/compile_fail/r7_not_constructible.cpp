// expect: loom R7: M cannot be constructed from the arguments given to model<M>
// The model's constructor does not take what model<M>(...) was given.
#include <loom/loom.hpp>

struct Net : torch::nn::Module {
  explicit Net(int width) : width(width) {}
  torch::Tensor forward(torch::Tensor x) { return x; }
  int width;
};

void build_it() {
#ifdef LOOM_CF_PASS
  auto job = loom::build(loom::model<Net>(8), loom::runtime::single_process());
#else
  auto job = loom::build(loom::model<Net>("eight"), loom::runtime::single_process());
#endif
  (void)job;
}

// expect: loom R7: M has no forward\(\.\.\.\): add the forward
// A module without forward is refused at build, not at the first job.forward. A TORCH_MODULE holder is
// judged by its module; the twin's forward is overloaded and a template, and a subclass inherits it.
#include <loom/loom.hpp>

struct Layers : torch::nn::Module {
  Layers() { register_module("fc", torch::nn::Linear(2, 2)); }
#ifdef LOOM_CF_PASS
  torch::Tensor forward(torch::Tensor x) { return x; }
  template <class T>
  torch::Tensor forward(torch::Tensor x, T) {
    return x;
  }
#endif
};
struct HeldImpl : Layers {};
TORCH_MODULE(Held);

void build_it() {
  auto job = loom::build(loom::model<Held>(), loom::runtime::single_process());
#ifdef LOOM_CF_PASS
  auto subclass = loom::build(loom::model<Layers>(), loom::runtime::single_process());
  (void)subclass;
#endif
  (void)job;
}

// expect: loom R14: the strategy's clip_grad_norm does not match the hook of that name: declare it as at::Tensor
// A user-written strategy's clip_grad_norm without norm_type: the job cannot call it, and used to fall
// back in silence to the local norm.
#include <loom/loom.hpp>

struct Net : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x) { return x * w; }
  torch::Tensor w = register_parameter("w", torch::zeros({4}));
};

struct clipped {
  static constexpr std::string_view name = "clipped";
  std::string options() const { return {}; }
  void setup(loom::strategy_context&) {}
  void before_forward(loom::strategy_context&) {}
  void after_backward(loom::strategy_context&) {}
#ifdef LOOM_CF_PASS
  at::Tensor clip_grad_norm(loom::strategy_context&, double, double) { return {}; }
#else
  at::Tensor clip_grad_norm(loom::strategy_context&, double) { return {}; }
#endif
};

void build_it() {
  auto job = loom::build(loom::model<Net>() | loom::strategy(clipped{}), loom::runtime::single_process());
  (void)job;
}

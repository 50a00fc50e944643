// expect: loom R14: the strategy shards its parameters \(shards_parameters = true\) but has no local_state
// A user-written sharding strategy that has every state hook but local_state: it would checkpoint
// whole tensors on every rank instead of each rank's shards.
#include <loom/loom.hpp>

struct Net : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x) { return x * w; }
  torch::Tensor w = register_parameter("w", torch::zeros({4}));
};

struct zero3 {
  static constexpr std::string_view name = "zero3";
  static constexpr bool shards_parameters = true;
  std::string options() const { return {}; }
  void setup(loom::strategy_context&) {}
  void before_forward(loom::strategy_context&) {}
  void after_backward(loom::strategy_context&) {}
  std::vector<at::Tensor> optimizer_parameters(const loom::strategy_context&) const { return {}; }
  at::Tensor clip_grad_norm(loom::strategy_context&, double, double) { return {}; }
  void with_full_parameters(loom::strategy_context&, const std::function<void()>& change) { change(); }
  loom::tensor_state full_state(loom::strategy_context&) { return {}; }
  void load_full_state(loom::strategy_context&, const loom::tensor_state&) {}
#ifdef LOOM_CF_PASS
  loom::tensor_state local_state(loom::strategy_context&) { return {}; }
#endif
  void load_local_state(loom::strategy_context&, const loom::tensor_state&) {}
  std::optional<at::Tensor> reshard_local(loom::strategy_context&, const std::string&, const std::vector<at::Tensor>&) {
    return std::nullopt;
  }
};

void build_it() {
  auto job = loom::build(loom::model<Net>() | loom::strategy(zero3{}), loom::runtime::single_process());
  (void)job;
}

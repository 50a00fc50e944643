// expect: loom R8: the strategy has no after_backward\(loom::strategy_context&\)
// A user-written strategy that misses a hook.
#include <loom/dsl.hpp>

struct Model {};
struct my_strategy {
  static constexpr std::string_view name = "mine";
  std::string options() const { return {}; }
  void setup(loom::strategy_context&) {}
  void before_forward(loom::strategy_context&) {}
#ifdef LOOM_CF_PASS
  void after_backward(loom::strategy_context&) {}
#endif
};

void compose() {
  auto pipeline = loom::model<Model>() | loom::strategy(my_strategy{});
  (void)pipeline;
}

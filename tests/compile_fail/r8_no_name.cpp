// expect: loom R8: the strategy has no static constexpr std::string_view name
// A user-written strategy without a name.
#include <loom/dsl.hpp>

struct Model {};
struct my_strategy {
#ifdef LOOM_CF_PASS
  static constexpr std::string_view name = "mine";
#endif
  std::string options() const { return {}; }
  void setup(loom::strategy_context&) {}
  void before_forward(loom::strategy_context&) {}
  void after_backward(loom::strategy_context&) {}
};

void compose() {
  auto pipeline = loom::model<Model>() | loom::strategy(my_strategy{});
  (void)pipeline;
}

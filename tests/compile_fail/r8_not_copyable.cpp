// expect: loom R8: the strategy is not copy-constructible
// A user-written strategy that cannot be copied (it owns a unique resource).
#include <loom/dsl.hpp>
#include <memory>

struct Model {};
struct my_strategy {
  static constexpr std::string_view name = "mine";
#ifdef LOOM_CF_PASS
  std::shared_ptr<int> state;
#else
  std::unique_ptr<int> state;
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

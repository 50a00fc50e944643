// expect: loom R2: seeded\(\.\.\.\) comes after the strategy
// A stage after the strategy.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::seeded(1) | loom::ddp();
#else
  auto pipeline = loom::model<Model>() | loom::ddp() | loom::seeded(1);
#endif
  (void)pipeline;
}

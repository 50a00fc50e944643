// expect: loom R18: recompute every is 0
// Every 0th unit.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::recompute({.every = 2});
#else
  auto pipeline = loom::model<Model>() | loom::recompute({.every = 0});
#endif
  (void)pipeline;
}

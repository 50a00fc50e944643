// expect: loom R18: the plan has two recompute\(\.\.\.\) stages
// Two recompute stages.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::recompute() | loom::ddp();
#else
  auto pipeline = loom::model<Model>() | loom::recompute() | loom::recompute({.every = 2}) | loom::ddp();
#endif
  (void)pipeline;
}

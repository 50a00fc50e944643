// expect: loom R15: the plan has two mixed_precision\(\.\.\.\) stages
// Two mixed_precision stages.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::mixed_precision() | loom::ddp();
#else
  auto pipeline = loom::model<Model>() | loom::mixed_precision() | loom::mixed_precision() | loom::ddp();
#endif
  (void)pipeline;
}

// expect: loom R13: the right side of \| is not a loom stage
// A stage function named but not called.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::ddp();
#else
  auto pipeline = loom::model<Model>() | loom::ddp;
#endif
  (void)pipeline;
}

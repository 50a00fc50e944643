// expect: loom R1: model<M>\(\.\.\.\) is not the first stage
// A stage piped into the model instead of the model into the stages.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::seeded(1);
#else
  auto pipeline = loom::seeded(1) | loom::model<Model>();
#endif
  (void)pipeline;
}

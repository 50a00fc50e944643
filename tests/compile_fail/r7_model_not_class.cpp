// expect: loom R7: model<M>\(\.\.\.\) needs a class type M
// A model type that is not a class.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>();
#else
  auto pipeline = loom::model<int>(1);
#endif
  (void)pipeline;
}

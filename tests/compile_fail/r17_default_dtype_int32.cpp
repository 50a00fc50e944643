// expect: loom R17: default_dtype\(\.\.\.\) is not a floating dtype
// A model built in an integral dtype.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::default_dtype(loom::fp16);
#else
  auto pipeline = loom::model<Model>() | loom::default_dtype(loom::dtype::int32);
#endif
  (void)pipeline;
}

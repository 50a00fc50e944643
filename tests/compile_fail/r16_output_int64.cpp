// expect: loom R16: mixed_precision output is not a floating dtype
// The forward result cast to an integral dtype.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::mixed_precision({.output = loom::fp32});
#else
  auto pipeline = loom::model<Model>() | loom::mixed_precision({.output = loom::dtype::int64});
#endif
  (void)pipeline;
}

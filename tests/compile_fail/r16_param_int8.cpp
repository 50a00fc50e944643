// expect: loom R16: mixed_precision param is not a floating dtype
// An integral compute dtype.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::mixed_precision({.param = loom::bf16});
#else
  auto pipeline = loom::model<Model>() | loom::mixed_precision({.param = loom::dtype::int8});
#endif
  (void)pipeline;
}

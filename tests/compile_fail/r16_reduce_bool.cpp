// expect: loom R16: mixed_precision reduce is not a floating dtype
// Gradients reduced in a non-floating dtype.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::mixed_precision({.reduce = loom::bf16});
#else
  auto pipeline = loom::model<Model>() | loom::mixed_precision({.reduce = loom::dtype::boolean});
#endif
  (void)pipeline;
}

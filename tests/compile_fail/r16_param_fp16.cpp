// expect: loom R16: mixed_precision param fp16 needs loss scaling
// fp16 compute, which would need loss scaling.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::default_dtype(loom::fp16) | loom::mixed_precision({.param = loom::bf16});
#else
  auto pipeline = loom::model<Model>() | loom::mixed_precision({.param = loom::fp16});
#endif
  (void)pipeline;
}

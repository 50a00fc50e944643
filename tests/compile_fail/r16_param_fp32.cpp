// expect: loom R16: mixed_precision param is fp32 or wider
// A compute dtype that is not narrower than fp32.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::mixed_precision({.param = loom::bf16, .reduce = loom::fp32});
#else
  auto pipeline = loom::model<Model>() | loom::mixed_precision({.param = loom::fp32});
#endif
  (void)pipeline;
}

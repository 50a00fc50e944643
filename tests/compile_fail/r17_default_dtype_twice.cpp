// expect: loom R17: default_dtype\(\.\.\.\) appears twice
// Two construction dtypes.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::seeded(1) | loom::default_dtype(loom::bf16);
#else
  auto pipeline = loom::model<Model>() | loom::default_dtype(loom::bf16) | loom::default_dtype(loom::fp32);
#endif
  (void)pipeline;
}

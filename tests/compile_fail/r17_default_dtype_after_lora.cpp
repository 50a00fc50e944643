// expect: loom R17: default_dtype\(\.\.\.\) is not directly after model<M>\(\.\.\.\) or seeded\(\.\.\.\)
// default_dtype after lora: the model is built by then.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::default_dtype(loom::bf16) | loom::lora(8);
#else
  auto pipeline = loom::model<Model>() | loom::lora(8) | loom::default_dtype(loom::bf16);
#endif
  (void)pipeline;
}

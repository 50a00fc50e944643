// expect: loom R10: trainable\(\.\.\.\) appears twice
// Two trainable stages.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::lora(8) | loom::trainable({"norm", "head"});
#else
  auto pipeline = loom::model<Model>() | loom::lora(8) | loom::trainable({"norm"}) | loom::trainable({"head"});
#endif
  (void)pipeline;
}

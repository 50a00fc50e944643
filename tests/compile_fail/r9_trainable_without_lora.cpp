// expect: loom R9: trainable\(\.\.\.\) has no lora\(\.\.\.\) before it
// trainable without lora: every parameter is trainable already.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::lora(8) | loom::trainable({"norm"});
#else
  auto pipeline = loom::model<Model>() | loom::trainable({"norm"}) | loom::lora(8);
#endif
  (void)pipeline;
}

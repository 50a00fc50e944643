// expect: loom R11: trainable\(\) has no patterns
// An empty trainable list.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::lora(8) | loom::trainable({"norm"});
#else
  auto pipeline = loom::model<Model>() | loom::lora(8) | loom::trainable({});
#endif
  (void)pipeline;
}

// expect: loom R5: lora alpha must be > 0
// A negative alpha.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::lora(8, loom::default_targets, {.alpha = 16});
#else
  auto pipeline = loom::model<Model>() | loom::lora(8, loom::default_targets, {.alpha = -16});
#endif
  (void)pipeline;
}

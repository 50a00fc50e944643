// expect: loom R5: lora rank must be > 0
// A rank-0 adapter.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::lora(8);
#else
  auto pipeline = loom::model<Model>() | loom::lora(0);
#endif
  (void)pipeline;
}

// expect: loom R4: seeded\(\.\.\.\) is not directly after model<M>
// seeded after lora: construction has already happened by then.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::seeded(1) | loom::lora(8);
#else
  auto pipeline = loom::model<Model>() | loom::lora(8) | loom::seeded(1);
#endif
  (void)pipeline;
}

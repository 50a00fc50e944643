// expect: loom R5: lora targets are empty
// An empty target list.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::lora(8, {"q_proj"});
#else
  auto pipeline = loom::model<Model>() | loom::lora(8, {});
#endif
  (void)pipeline;
}

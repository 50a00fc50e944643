// expect: loom R5: a lora target is listed twice
// The same target twice.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::lora(8, {"q_proj", "v_proj"});
#else
  auto pipeline = loom::model<Model>() | loom::lora(8, {"q_proj", "v_proj", "q_proj"});
#endif
  (void)pipeline;
}

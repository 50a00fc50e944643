// expect: loom R6: the plan has two lora\(\.\.\.\) stages
// Two adapter sets.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::lora(8, {"q_proj", "v_proj"});
#else
  auto pipeline = loom::model<Model>() | loom::lora(8, {"q_proj"}) | loom::lora(8, {"v_proj"});
#endif
  (void)pipeline;
}

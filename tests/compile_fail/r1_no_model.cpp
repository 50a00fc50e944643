// expect: loom R1: the plan has no model: start it with loom::model<M>
// A pipeline without a model handed where a plan is needed (as loom::build does).
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | (loom::seeded(1) | loom::lora(8) | loom::ddp());
  loom::require_plan<decltype(pipeline)>();
#else
  auto pipeline = loom::seeded(1) | loom::lora(8) | loom::ddp();
  loom::require_plan<decltype(pipeline)>();
#endif
  (void)pipeline;
}

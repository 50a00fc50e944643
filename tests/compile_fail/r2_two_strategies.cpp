// expect: loom R2: the plan has two strategies
// ddp() and fsdp() in one plan.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::fsdp();
#else
  auto pipeline = loom::model<Model>() | loom::ddp() | loom::fsdp();
#endif
  (void)pipeline;
}

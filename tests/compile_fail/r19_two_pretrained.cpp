// expect: loom R19: the plan has two pretrained\(\.\.\.\) stages
// Two checkpoints.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::pretrained("base/") | loom::ddp();
#else
  auto pipeline = loom::model<Model>() | loom::pretrained("base/") | loom::pretrained("other/") | loom::ddp();
#endif
  (void)pipeline;
}

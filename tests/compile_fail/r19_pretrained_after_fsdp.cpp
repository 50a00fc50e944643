// expect: loom R19: pretrained\(\.\.\.\) comes after the strategy
// The checkpoint loaded after the strategy wrapped the model.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::pretrained("base/") | loom::fsdp();
#else
  auto pipeline = loom::model<Model>() | loom::fsdp() | loom::pretrained("base/");
#endif
  (void)pipeline;
}

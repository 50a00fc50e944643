// expect: loom R19: pretrained\(\.\.\.\) comes after lora\(\.\.\.\)
// The checkpoint loaded after the adapters were added.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::seeded(1) | loom::pretrained("base/") | loom::lora(8) | loom::fsdp();
#else
  auto pipeline = loom::model<Model>() | loom::seeded(1) | loom::lora(8) | loom::pretrained("base/") | loom::fsdp();
#endif
  (void)pipeline;
}

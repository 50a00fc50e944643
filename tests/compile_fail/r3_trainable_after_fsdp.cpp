// expect: loom R3: trainable\(\.\.\.\) comes after fsdp\(\): put trainable before the strategy
// trainable after fsdp.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::lora(8) | loom::trainable({"norm"}) | loom::fsdp();
#else
  auto pipeline = loom::model<Model>() | loom::lora(8) | loom::fsdp() | loom::trainable({"norm"});
#endif
  (void)pipeline;
}

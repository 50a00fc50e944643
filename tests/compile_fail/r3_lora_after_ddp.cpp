// expect: loom R3: lora\(\.\.\.\) comes after ddp\(\): put lora before the strategy
// lora after ddp: DDP would build its reducer before the adapters exist.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::lora(8) | loom::ddp();
#else
  auto pipeline = loom::model<Model>() | loom::ddp() | loom::lora(8);
#endif
  (void)pipeline;
}

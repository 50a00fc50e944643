// expect: loom R18: recompute\(\.\.\.\) comes after the strategy
// recompute piped after the strategy.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::lora(8) | loom::recompute() | loom::fsdp();
#else
  auto pipeline = loom::model<Model>() | loom::lora(8) | loom::fsdp() | loom::recompute();
#endif
  (void)pipeline;
}

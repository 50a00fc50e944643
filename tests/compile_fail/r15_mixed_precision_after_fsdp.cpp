// expect: loom R15: mixed_precision\(\.\.\.\) comes after the strategy
// mixed_precision piped after the strategy.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::mixed_precision() | loom::fsdp();
#else
  auto pipeline = loom::model<Model>() | loom::fsdp() | loom::mixed_precision();
#endif
  (void)pipeline;
}

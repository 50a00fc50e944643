// expect: loom R20: sequence_parallel\(\.\.\.\) comes after the strategy
// sequence_parallel piped after the strategy.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::lora(8) | loom::sequence_parallel(2) | loom::ddp();
#else
  auto pipeline = loom::model<Model>() | loom::lora(8) | loom::ddp() | loom::sequence_parallel(2);
#endif
  (void)pipeline;
}

// expect: loom R22: tensor_parallel\(\.\.\.\) comes after the strategy
// tensor_parallel piped after the strategy.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::lora(8) | loom::tensor_parallel(2) | loom::ddp();
#else
  auto pipeline = loom::model<Model>() | loom::lora(8) | loom::ddp() | loom::tensor_parallel(2);
#endif
  (void)pipeline;
}

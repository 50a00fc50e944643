// expect: loom R21: quantized\(\.\.\.\) without lora\(\.\.\.\) leaves nothing to train
// A quantized base with no adapters over it.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::quantized(loom::nf4) | loom::lora(16) | loom::ddp();
#else
  auto pipeline = loom::model<Model>() | loom::quantized(loom::nf4) | loom::ddp();
#endif
  (void)pipeline;
}

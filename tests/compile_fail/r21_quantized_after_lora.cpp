// expect: loom R21: quantized\(\.\.\.\) comes after lora\(\.\.\.\)
// The adapters added before the base was quantized.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::quantized(loom::nf4) | loom::lora(8) | loom::fsdp();
#else
  auto pipeline = loom::model<Model>() | loom::lora(8) | loom::quantized(loom::nf4) | loom::fsdp();
#endif
  (void)pipeline;
}

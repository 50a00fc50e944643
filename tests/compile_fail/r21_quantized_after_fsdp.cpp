// expect: loom R21: quantized\(\.\.\.\) comes after the strategy
// Quantized after the strategy wrapped the model.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::quantized(loom::fp8) | loom::lora(8) | loom::fsdp();
#else
  auto pipeline = loom::model<Model>() | loom::lora(8) | loom::fsdp() | loom::quantized(loom::fp8);
#endif
  (void)pipeline;
}

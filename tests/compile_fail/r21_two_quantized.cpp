// expect: loom R21: the plan has two quantized\(\.\.\.\) stages
// Quantized twice, in two formats.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::quantized(loom::nf4) | loom::lora(8) | loom::fsdp();
#else
  auto pipeline =
      loom::model<Model>() | loom::quantized(loom::nf4) | loom::quantized(loom::fp8) | loom::lora(8) | loom::fsdp();
#endif
  (void)pipeline;
}

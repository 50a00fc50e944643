// expect: loom R21: quantized\(\.\.\.\) comes before pretrained\(\.\.\.\)
// The base quantized before its weights were read.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline =
      loom::model<Model>() | loom::pretrained("base/") | loom::quantized(loom::nf4) | loom::lora(8) | loom::ddp();
#else
  auto pipeline =
      loom::model<Model>() | loom::quantized(loom::nf4) | loom::pretrained("base/") | loom::lora(8) | loom::ddp();
#endif
  (void)pipeline;
}

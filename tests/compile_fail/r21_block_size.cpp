// expect: loom R21: quantized block_size is not a power of two from 32 to 4096
// A block that bitsandbytes does not take.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::quantized({.format = loom::nf4, .block_size = 128}) | loom::lora(8);
#else
  auto pipeline = loom::model<Model>() | loom::quantized({.format = loom::nf4, .block_size = 100}) | loom::lora(8);
#endif
  (void)pipeline;
}

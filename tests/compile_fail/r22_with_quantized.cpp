// expect: loom R22: tensor_parallel\(\.\.\.\) and quantized\(\.\.\.\) are in one plan
// A quantized base split across ranks.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::tensor_parallel(2);
#else
  auto pipeline = loom::model<Model>() | loom::quantized(loom::nf4) | loom::tensor_parallel(2);
#endif
  (void)pipeline;
}

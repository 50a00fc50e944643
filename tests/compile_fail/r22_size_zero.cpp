// expect: loom R22: tensor_parallel size is 0
// A group of no ranks.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::tensor_parallel(1);
#else
  auto pipeline = loom::model<Model>() | loom::tensor_parallel(0);
#endif
  (void)pipeline;
}

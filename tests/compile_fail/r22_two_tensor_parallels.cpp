// expect: loom R22: the plan has two tensor_parallel\(\.\.\.\) stages
// Two tensor_parallel stages.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::tensor_parallel(2) | loom::fsdp();
#else
  auto pipeline = loom::model<Model>() | loom::tensor_parallel(2) | loom::tensor_parallel(4) | loom::fsdp();
#endif
  (void)pipeline;
}

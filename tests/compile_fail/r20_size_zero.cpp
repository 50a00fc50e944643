// expect: loom R20: sequence_parallel size is 0
// A group of no ranks.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::sequence_parallel(1);
#else
  auto pipeline = loom::model<Model>() | loom::sequence_parallel(0);
#endif
  (void)pipeline;
}

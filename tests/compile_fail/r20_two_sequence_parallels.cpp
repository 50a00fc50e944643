// expect: loom R20: the plan has two sequence_parallel\(\.\.\.\) stages
// Two sequence_parallel stages.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::sequence_parallel(2) | loom::fsdp();
#else
  auto pipeline = loom::model<Model>() | loom::sequence_parallel(2) | loom::sequence_parallel(4) | loom::fsdp();
#endif
  (void)pipeline;
}

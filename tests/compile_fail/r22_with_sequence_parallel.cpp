// expect: loom R22: tensor_parallel\(\.\.\.\) and sequence_parallel\(\.\.\.\) both split the ranks
// Each sequence split and each layer split, on one mesh. A rule on two stages' values, so the plan is
// a constant: a plan made at run time throws the sentence as a plan_error where it is made.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  constexpr auto pipeline = loom::model<Model>() | loom::sequence_parallel(1) | loom::tensor_parallel(2) | loom::fsdp();
#else
  constexpr auto pipeline = loom::model<Model>() | loom::sequence_parallel(2) | loom::tensor_parallel(2) | loom::fsdp();
#endif
  (void)pipeline;
}

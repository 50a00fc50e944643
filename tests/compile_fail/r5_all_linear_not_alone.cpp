// expect: loom R5: loom::all_linear is a whole target list
// all-linear beside a name.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::lora(8, {loom::all_linear});
#else
  auto pipeline = loom::model<Model>() | loom::lora(8, {loom::all_linear, "lm_head"});
#endif
  (void)pipeline;
}

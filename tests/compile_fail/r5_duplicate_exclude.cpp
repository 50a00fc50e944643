// expect: loom R5: a lora exclude entry is listed twice
// The same exclusion twice.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::lora(8, loom::default_targets, {.exclude = {"head"}});
#else
  auto pipeline = loom::model<Model>() | loom::lora(8, loom::default_targets, {.exclude = {"head", "head"}});
#endif
  (void)pipeline;
}

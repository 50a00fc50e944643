// expect: loom R5: a lora modules_to_save entry is empty
// A modules_to_save entry that names nothing.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::lora(8, loom::default_targets, {.modules_to_save = {"lm_head"}});
#else
  auto pipeline = loom::model<Model>() | loom::lora(8, loom::default_targets, {.modules_to_save = {""}});
#endif
  (void)pipeline;
}

// expect: loom R5: a lora modules_to_save entry is listed twice
// The same module to save twice.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline =
      loom::model<Model>() | loom::lora(8, loom::default_targets, {.modules_to_save = {"lm_head", "embed_tokens"}});
#else
  auto pipeline =
      loom::model<Model>() | loom::lora(8, loom::default_targets, {.modules_to_save = {"lm_head", "lm_head"}});
#endif
  (void)pipeline;
}

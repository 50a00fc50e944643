// expect: loom R5: a lora alpha_pattern value must be > 0
// An alpha_pattern that flips a layer's update.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::lora(8, loom::default_targets, {.alpha_pattern = {{"q_proj", 4}}});
#else
  auto pipeline = loom::model<Model>() | loom::lora(8, loom::default_targets, {.alpha_pattern = {{"q_proj", -4}}});
#endif
  (void)pipeline;
}

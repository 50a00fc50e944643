// expect: loom R5: a lora rank_pattern or alpha_pattern key is listed twice
// The same alpha_pattern key twice.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline =
      loom::model<Model>() | loom::lora(8, loom::default_targets, {.alpha_pattern = {{"q_proj", 4}, {"v_proj", 2}}});
#else
  auto pipeline =
      loom::model<Model>() | loom::lora(8, loom::default_targets, {.alpha_pattern = {{"q_proj", 4}, {"q_proj", 2}}});
#endif
  (void)pipeline;
}

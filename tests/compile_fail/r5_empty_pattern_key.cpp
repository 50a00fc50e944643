// expect: loom R5: a lora rank_pattern or alpha_pattern key is empty
// A rank_pattern key that names nothing.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::lora(8, loom::default_targets, {.rank_pattern = {{"q_proj", 4}}});
#else
  auto pipeline = loom::model<Model>() | loom::lora(8, loom::default_targets, {.rank_pattern = {{"", 4}}});
#endif
  (void)pipeline;
}

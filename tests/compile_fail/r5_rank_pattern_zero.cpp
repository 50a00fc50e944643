// expect: loom R5: a lora rank_pattern value must be a whole number > 0
// A rank_pattern that gives a layer rank 0.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::lora(8, loom::default_targets, {.rank_pattern = {{"q_proj", 4}}});
#else
  auto pipeline = loom::model<Model>() | loom::lora(8, loom::default_targets, {.rank_pattern = {{"q_proj", 0}}});
#endif
  (void)pipeline;
}

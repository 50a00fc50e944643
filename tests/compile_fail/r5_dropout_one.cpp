// expect: loom R5: lora dropout must be in \[0, 1\)
// Dropout 1 zeroes the adapter's input.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::lora(8, loom::default_targets, {.dropout = 0.1});
#else
  auto pipeline = loom::model<Model>() | loom::lora(8, loom::default_targets, {.dropout = 1.0});
#endif
  (void)pipeline;
}

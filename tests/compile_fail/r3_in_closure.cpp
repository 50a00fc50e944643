// expect: loom R3: lora\(\.\.\.\) comes after the strategy
// A partial pipeline is checked when it is composed, before it meets a model.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::lora(8) | loom::local();
#else
  auto pipeline = loom::local() | loom::lora(8);
#endif
  (void)pipeline;
}

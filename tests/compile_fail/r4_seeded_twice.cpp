// expect: loom R4: seeded\(\.\.\.\) appears twice
// Two seeds.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::seeded(1);
#else
  auto pipeline = loom::model<Model>() | loom::seeded(1) | loom::seeded(2);
#endif
  (void)pipeline;
}

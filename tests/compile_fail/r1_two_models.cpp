// expect: loom R1: the plan has two models
// Two plans piped together.
#include <loom/dsl.hpp>

struct Model {};
struct Other {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::seeded(1);
#else
  auto pipeline = loom::model<Model>() | loom::model<Other>();
#endif
  (void)pipeline;
}

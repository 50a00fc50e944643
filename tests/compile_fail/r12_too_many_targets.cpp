// expect: loom R12: a target list holds at most 16 entries
// Seventeen targets: one pattern says it shorter.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::lora(8, {loom::pattern("l[0-9]+")});
#else
  auto pipeline = loom::model<Model>() | loom::lora(8, {"l0", "l1", "l2", "l3", "l4", "l5", "l6", "l7", "l8", "l9",
                                                        "l10", "l11", "l12", "l13", "l14", "l15", "l16"});
#endif
  (void)pipeline;
}

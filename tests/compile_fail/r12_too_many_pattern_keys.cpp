// expect: loom R12: a rank_pattern or alpha_pattern holds at most 16 keys
// Seventeen rank_pattern keys.
#include <loom/dsl.hpp>

struct Model {};

void compose() {
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::lora(8, loom::default_targets,
                                                    {.rank_pattern = {{"l0", 2},
                                                                      {"l1", 2},
                                                                      {"l2", 2},
                                                                      {"l3", 2},
                                                                      {"l4", 2},
                                                                      {"l5", 2},
                                                                      {"l6", 2},
                                                                      {"l7", 2},
                                                                      {"l8", 2},
                                                                      {"l9", 2},
                                                                      {"l10", 2},
                                                                      {"l11", 2},
                                                                      {"l12", 2},
                                                                      {"l13", 2},
                                                                      {"l14", 2},
                                                                      {"l15", 2}}});
#else
  auto pipeline = loom::model<Model>() | loom::lora(8, loom::default_targets,
                                                    {.rank_pattern = {{"l0", 2},
                                                                      {"l1", 2},
                                                                      {"l2", 2},
                                                                      {"l3", 2},
                                                                      {"l4", 2},
                                                                      {"l5", 2},
                                                                      {"l6", 2},
                                                                      {"l7", 2},
                                                                      {"l8", 2},
                                                                      {"l9", 2},
                                                                      {"l10", 2},
                                                                      {"l11", 2},
                                                                      {"l12", 2},
                                                                      {"l13", 2},
                                                                      {"l14", 2},
                                                                      {"l15", 2},
                                                                      {"l16", 2}}});
#endif
  (void)pipeline;
}

// expect: is not a constant expression|not usable in a constant expression
// lora(...) takes constants; a value known only at run time goes through lora_stage::checked, which
// runs the same checks and throws loom::plan_error.
#include <loom/dsl.hpp>

struct Model {};
int rank_from_config() { return 8; }

void compose() {
  const int rank = rank_from_config();
#ifdef LOOM_CF_PASS
  auto pipeline = loom::model<Model>() | loom::lora_stage::checked(rank);
#else
  auto pipeline = loom::model<Model>() | loom::lora(rank);
#endif
  (void)pipeline;
}

// expect: loom canary: this case must fail
// Proves that the harness sees a failing compile and reads its first error line.
#include <loom/dsl.hpp>

#ifndef LOOM_CF_PASS
static_assert(sizeof(int) == 0, "loom canary: this case must fail");
#endif

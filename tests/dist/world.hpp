#pragma once
// The one runtime a distributed test process joins, started by loom-run.

#include <loom/runtime/runtime.hpp>

namespace loom::testing {

inline runtime& world() {
  static runtime instance = runtime::from_env();
  return instance;
}

}  // namespace loom::testing

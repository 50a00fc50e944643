#pragma once
// What the C heap holds: on the CPU, LibTorch's allocator takes tensor storage from it, so this is
// the memory in use that a GPU's allocator statistics would give.

#include <malloc.h>

#include <cstdint>

namespace loom::testing {

inline std::int64_t heap_in_use() {
  const struct mallinfo2 info = mallinfo2();
  return static_cast<std::int64_t>(info.uordblks + info.hblkhd);
}

}  // namespace loom::testing

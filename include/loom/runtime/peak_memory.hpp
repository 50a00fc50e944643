#pragma once
// How much memory a rank needed at most: what a user sizes the next run's machines by. On a GPU it is
// the caching allocator's peak of bytes allocated to tensors (torch.cuda.max_memory_allocated); on
// the CPU, where LibTorch keeps no such count, the process's peak resident set, which also holds the
// program and the libraries and so overstates the tensors.

#include <c10/core/Device.h>

#include <cstdint>
#include <string_view>

namespace loom {

// Starts the device's count afresh, so that a later peak is this stretch's (the CPU's resident peak
// is the process's and cannot be reset).
void reset_peak_memory(c10::Device device);

// This process's peak, in bytes, on `device`.
[[nodiscard]] std::int64_t peak_memory_bytes(c10::Device device);

// What peak_memory_bytes measures there, for a report: "allocated on cuda:0", "resident".
[[nodiscard]] std::string_view peak_memory_kind(c10::Device device) noexcept;

}  // namespace loom

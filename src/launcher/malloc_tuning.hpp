#pragma once
// How loom-run sets up each rank's heap (glibc's malloc, through GLIBC_TUNABLES), as PyTorch's CPU
// launcher (torch.backends.xeon.run_cpu) sets up jemalloc's. A training step frees and allocates
// the same large activations every step; by default glibc returns the top of its heap to the kernel
// once 32 MiB or so of it is free, and the next step takes the pages back one fault at a time,
// each zeroed by the kernel (in TinyGpt at context 512, a tenth of a rank's memory traffic). Tuned:
//   - glibc.malloc.mmap_threshold = 32 MiB: what glibc's own sliding threshold would reach after the
//     first large free, fixed from the start; larger requests (a 7B model's gathered unit) are still
//     mapped and unmapped whole, so they are not kept at rest;
//   - glibc.malloc.trim_threshold = 1 GiB: the heap keeps up to that much freed memory for the next
//     step instead of giving it back; peak memory is unchanged, memory at rest can be that much more.
// Or another allocator, preloaded into each rank (LD_PRELOAD), as run_cpu preloads them: tcmalloc keeps
// freed blocks in per-thread and per-size caches, which a step's allocations of the same sizes hit
// again (docs/launcher.md has what it changes: mostly peak memory).

#include "options.hpp"

#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom::launcher {

// `inherited` (GLIBC_TUNABLES's value, empty when unset) with loom's malloc tunables added, each one
// only where `inherited` does not set it already: a user's own value wins.
[[nodiscard]] std::string with_malloc_tuning(std::string_view inherited);

// Where a preloaded allocator is looked for: LD_LIBRARY_PATH's folders (`ld_library_path`, its value),
// then the system's library folders.
[[nodiscard]] std::vector<std::filesystem::path> allocator_folders(std::string_view ld_library_path);

// The first of `allocator`'s libraries (tcmalloc or jemalloc) in `folders`; throws usage_error naming
// the library, where it looked and the package that has it when there is none.
[[nodiscard]] std::filesystem::path find_allocator(heap_allocator allocator,
                                                   std::span<const std::filesystem::path> folders);

// jemalloc's settings under run_cpu (MALLOC_CONF), for a rank that does not set its own.
inline constexpr std::string_view jemalloc_conf = "oversize_threshold:1,background_thread:true,metadata_thp:auto";

}  // namespace loom::launcher

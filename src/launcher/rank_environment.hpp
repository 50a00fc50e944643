#pragma once

#include "options.hpp"

#include <string>
#include <vector>

namespace loom::launcher {

// Where rank 0 hosts the c10d TCPStore that every rank meets at.
struct rendezvous_point {
  std::string address;
  int port = 0;
};

// The options' master, or for a single node 127.0.0.1 and a port that was free a moment ago
// (the same small race torchrun accepts: rank 0 binds it moments later): another one each time the
// ranks are started again.
[[nodiscard]] rendezvous_point resolve_rendezvous(const launch_options& options);

// CPUs this process may run on (its affinity mask), at least 1.
[[nodiscard]] int available_cores();

// The launcher's own environment as NAME=VALUE strings.
[[nodiscard]] std::vector<std::string> current_environment();

// `inherited` with torchrun's per-rank variables set for `local_rank` in the start numbered
// `restart_count` (0 for the first); OMP_NUM_THREADS becomes
// max(1, cores / local ranks) unless `inherited` already has it; the options' allocator set up
// (malloc_tuning.hpp): GLIBC_TUNABLES gains loom's malloc tuning, or LD_PRELOAD starts with tcmalloc or
// jemalloc (usage_error when it is not found); LOOM_ERROR_FILE is `error_file`.
[[nodiscard]] std::vector<std::string> rank_environment(std::vector<std::string> inherited,
                                                        const launch_options& options, const rendezvous_point& master,
                                                        int restart_count, int local_rank, int cores,
                                                        const std::string& error_file);

}  // namespace loom::launcher

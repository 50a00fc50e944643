#pragma once

#include "options.hpp"
#include "rank_environment.hpp"

namespace loom::launcher {

// Starts this node's ranks, relays their output, stops them all when one fails or when the
// launcher gets SIGINT, SIGTERM or SIGHUP, and returns loom-run's exit status: 0 when every rank
// exited 0, 1 when a rank failed, 128 + N when stopped by signal N. The last line on stderr
// says which rank failed first and how, or which signal stopped the run.
[[nodiscard]] int supervise(const launch_options& options, const rendezvous_point& master);

}  // namespace loom::launcher

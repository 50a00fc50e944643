#pragma once

#include "options.hpp"

namespace loom::launcher {

// Starts this node's ranks, relays their output, stops them all when one fails or when the
// launcher gets SIGINT, SIGTERM or SIGHUP, starts them all again after a failure while
// --max-restarts allows, and returns loom-run's exit status: 0 when every rank exited 0, 1 when a
// rank failed and no restart was left, 75 when ranks stopped to be resumed, 128 + N when stopped by
// signal N. The last line on stderr says which rank failed first and how, or which signal stopped
// the run.
[[nodiscard]] int supervise(const launch_options& options);

}  // namespace loom::launcher

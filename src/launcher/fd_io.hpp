#pragma once

#include "unique_fd.hpp"

#include <string_view>

namespace loom::launcher {

struct pipe_ends {
  unique_fd read_end;
  unique_fd write_end;
};

// Both ends close-on-exec, so no rank inherits another rank's pipe. Throws std::system_error.
[[nodiscard]] pipe_ends make_pipe();

void set_nonblocking(int fd);

// Writes everything unless the reader is gone (EPIPE): the launcher must keep supervising
// its ranks even when nobody reads its output any more.
void write_all(int fd, std::string_view bytes) noexcept;

}  // namespace loom::launcher

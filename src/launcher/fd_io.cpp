#include "fd_io.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

namespace loom::launcher {

pipe_ends make_pipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw std::system_error{errno, std::generic_category(), "pipe2"};
  return {unique_fd{fds[0]}, unique_fd{fds[1]}};
}

void set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0)
    throw std::system_error{errno, std::generic_category(), "fcntl(O_NONBLOCK)"};
}

void write_all(int fd, std::string_view bytes) noexcept {
  while (!bytes.empty()) {
    const ssize_t written = ::write(fd, bytes.data(), bytes.size());
    if (written < 0) {
      if (errno == EINTR) continue;
      return;  // EPIPE or a closed descriptor: drop the output, keep supervising
    }
    bytes.remove_prefix(static_cast<std::size_t>(written));
  }
}

}  // namespace loom::launcher

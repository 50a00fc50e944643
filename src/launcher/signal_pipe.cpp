#include "signal_pipe.hpp"

#include <unistd.h>

#include <cerrno>
#include <system_error>

namespace loom::launcher {
namespace {

int signal_write_fd = -1;  // the handler's only state

extern "C" void on_signal(int signal_number) {
  const int saved_errno = errno;
  const auto byte = static_cast<unsigned char>(signal_number);
  // Non-blocking: with a full pipe the wake-up is already pending, so dropping is harmless.
  [[maybe_unused]] const auto ignored = ::write(signal_write_fd, &byte, 1);
  errno = saved_errno;
}

}  // namespace

signal_pipe::signal_pipe(std::initializer_list<int> caught) : pipe_{make_pipe()} {
  set_nonblocking(pipe_.read_end.get());
  set_nonblocking(pipe_.write_end.get());
  signal_write_fd = pipe_.write_end.get();

  struct sigaction handler {};
  handler.sa_handler = on_signal;
  handler.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  sigemptyset(&handler.sa_mask);
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);

  const auto install = [this](int signal_number, const struct sigaction& action) {
    saved_disposition saved{signal_number, {}};
    if (::sigaction(signal_number, &action, &saved.action) != 0)
      throw std::system_error{errno, std::generic_category(), "sigaction"};
    saved_.push_back(saved);
  };
  for (const int signal_number : caught) install(signal_number, handler);
  install(SIGPIPE, ignore);
}

signal_pipe::~signal_pipe() {
  restore_dispositions();
  signal_write_fd = -1;
}

std::vector<int> signal_pipe::take_received() {
  std::vector<int> received;
  unsigned char bytes[64];
  ssize_t count = 0;
  while ((count = ::read(pipe_.read_end.get(), bytes, sizeof bytes)) > 0)
    received.insert(received.end(), bytes, bytes + count);
  return received;
}

void signal_pipe::restore_dispositions() const noexcept {
  for (const auto& [signal_number, action] : saved_) ::sigaction(signal_number, &action, nullptr);
}

all_signals_blocked::all_signals_blocked() {
  sigset_t all;
  sigfillset(&all);
  ::sigprocmask(SIG_SETMASK, &all, &previous_);
}

all_signals_blocked::~all_signals_blocked() { ::sigprocmask(SIG_SETMASK, &previous_, nullptr); }

void all_signals_blocked::unblock_in_child() const noexcept { ::sigprocmask(SIG_SETMASK, &previous_, nullptr); }

}  // namespace loom::launcher

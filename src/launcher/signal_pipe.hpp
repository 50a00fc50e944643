#pragma once

#include "fd_io.hpp"

#include <signal.h>

#include <initializer_list>
#include <vector>

namespace loom::launcher {

// Turns the launcher's signals into bytes on a pipe, so that one poll() waits for rank output,
// rank exits (SIGCHLD) and SIGINT/SIGTERM alike. One instance at a time; it also ignores
// SIGPIPE, so that a closed stdout does not kill the launcher while ranks still run.
class signal_pipe {
 public:
  explicit signal_pipe(std::initializer_list<int> caught);
  ~signal_pipe();
  signal_pipe(const signal_pipe&) = delete;
  signal_pipe& operator=(const signal_pipe&) = delete;

  [[nodiscard]] int fd() const { return pipe_.read_end.get(); }
  [[nodiscard]] std::vector<int> take_received();  // in arrival order, once each

  // Puts back the dispositions found at start. Async-signal-safe: for a forked child before exec.
  void restore_dispositions() const noexcept;

 private:
  struct saved_disposition {
    int signal_number;
    struct sigaction action;
  };

  pipe_ends pipe_;
  std::vector<saved_disposition> saved_;
};

// Blocks every signal for its lifetime: a forked child must not run the launcher's handlers
// between fork and exec, nor miss a signal sent to it in that window.
class all_signals_blocked {
 public:
  all_signals_blocked();
  ~all_signals_blocked();
  all_signals_blocked(const all_signals_blocked&) = delete;
  all_signals_blocked& operator=(const all_signals_blocked&) = delete;

  // In the child: lets signals through again, as they were before the block.
  void unblock_in_child() const noexcept;

 private:
  sigset_t previous_;
};

}  // namespace loom::launcher

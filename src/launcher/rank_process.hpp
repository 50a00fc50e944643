#pragma once

#include "exit_status.hpp"
#include "signal_pipe.hpp"

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace loom::launcher {

// What one rank runs, and where its output goes.
struct rank_command {
  int rank = 0;                          // global rank, for messages
  std::vector<std::string> program;      // the program, then its arguments
  std::vector<std::string> environment;  // NAME=VALUE
  int stdout_fd = -1;                    // write ends the rank gets as its stdout and stderr
  int stderr_fd = -1;
};

// One rank: a child in a session of its own (as torchrun's start_new_session), so a signal sent
// to its process group also reaches whatever it started. Once it exits it stays a zombie until
// this object goes away: that keeps its pid, and so its process group id, from being reused
// while the launcher may still signal the group.
class rank_process {
 public:
  // Throws std::system_error when fork fails. A program that cannot be executed makes the
  // rank print why and exit with code 127, like a shell.
  rank_process(const rank_command& command, const signal_pipe& signals);
  rank_process(rank_process&& other) noexcept;
  rank_process& operator=(rank_process&&) = delete;
  rank_process(const rank_process&) = delete;
  rank_process& operator=(const rank_process&) = delete;

  // SIGKILLs the rank if it still runs and whatever remains of its process group, then
  // reaps it: nothing a rank started outlives the launcher, even when it throws.
  ~rank_process();

  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] pid_t pid() const { return pid_; }

  // The exit status once the rank has exited; checks without blocking and without reaping.
  [[nodiscard]] const std::optional<exit_status>& check_exit();
  [[nodiscard]] bool running() const { return !exit_.has_value(); }

  void send(int signal_number) const;  // to the rank's whole process group

 private:
  int rank_;
  pid_t pid_;
  std::optional<exit_status> exit_;
};

}  // namespace loom::launcher

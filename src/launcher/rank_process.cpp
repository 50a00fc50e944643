#include "rank_process.hpp"

#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <cerrno>
#include <cstring>
#include <string_view>
#include <system_error>
#include <utility>

extern char** environ;

namespace loom::launcher {
namespace {

std::vector<char*> as_null_terminated(const std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (const std::string& s : strings) pointers.push_back(const_cast<char*>(s.c_str()));
  pointers.push_back(nullptr);
  return pointers;
}

void write_error(std::string_view text) noexcept {
  [[maybe_unused]] const auto ignored = ::write(STDERR_FILENO, text.data(), text.size());
}

// Runs in the forked child; never returns.
[[noreturn]] void become_rank(const rank_command& command, char** argv, char** envp, pid_t launcher,
                              const signal_pipe& signals, const all_signals_blocked& blocked) {
  signals.restore_dispositions();
  blocked.unblock_in_child();
  ::setsid();
#ifdef __linux__
  // If the launcher is SIGKILLed it cannot stop its ranks; the kernel does it for it.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != launcher) ::_exit(127);  // it died before the line above
#endif
  if (::dup2(command.stdout_fd, STDOUT_FILENO) < 0 || ::dup2(command.stderr_fd, STDERR_FILENO) < 0) ::_exit(127);
  environ = envp;  // execvp takes the environment from here, and searches this PATH
  ::execvp(argv[0], argv);
  const int error = errno;
  write_error("loom-run: cannot run '");
  write_error(argv[0]);
  write_error("': ");
  write_error(std::strerror(error));
  write_error("\n");
  ::_exit(127);
}

}  // namespace

rank_process::rank_process(const rank_command& command, const signal_pipe& signals) : rank_{command.rank}, pid_{-1} {
  // Prepared before fork, so the child only makes system calls.
  std::vector<char*> argv = as_null_terminated(command.program);
  std::vector<char*> envp = as_null_terminated(command.environment);
  const pid_t launcher = ::getpid();

  const all_signals_blocked blocked;
  pid_ = ::fork();
  if (pid_ < 0) throw std::system_error{errno, std::generic_category(), "fork"};
  if (pid_ == 0) become_rank(command, argv.data(), envp.data(), launcher, signals, blocked);
}

rank_process::rank_process(rank_process&& other) noexcept
    : rank_{other.rank_}, pid_{std::exchange(other.pid_, -1)}, exit_{std::move(other.exit_)} {}

rank_process::~rank_process() {
  if (pid_ <= 0) return;
  send(SIGKILL);  // the rank if it still runs, and what it started
  while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
}

const std::optional<exit_status>& rank_process::check_exit() {
  if (exit_) return exit_;
  siginfo_t info{};
  const int waited = ::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT);
  if (waited == 0 && info.si_pid == pid_)  // si_pid stays 0 while the rank runs
    exit_ = exit_status::from(info);
  return exit_;
}

void rank_process::send(int signal_number) const {
  // Before the child's setsid() the group does not exist yet; the signal then waits, blocked,
  // in the child itself and acts once it restored the default dispositions.
  if (::kill(-pid_, signal_number) != 0 && errno == ESRCH) ::kill(pid_, signal_number);
}

}  // namespace loom::launcher

#include "exit_status.hpp"

#include <array>
#include <utility>

namespace loom::launcher {

exit_status exit_status::from(const siginfo_t& child_info) {
  if (child_info.si_code == CLD_EXITED) return {kind::exited, child_info.si_status};
  return {kind::killed, child_info.si_status};  // CLD_KILLED or CLD_DUMPED
}

std::string exit_status::describe() const {
  if (how == kind::exited) return "exited with code " + std::to_string(value);
  return "killed by signal " + std::to_string(value) + " (" + signal_name(value) + ")";
}

std::string signal_name(int signal_number) {
  // POSIX names; the numbers differ between systems, so the table is keyed by the macros.
  static constexpr std::array<std::pair<int, std::string_view>, 24> names{{
      {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},   {SIGTRAP, "SIGTRAP"},
      {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},   {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"},
      {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"}, {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"},
      {SIGCHLD, "SIGCHLD"}, {SIGCONT, "SIGCONT"}, {SIGSTOP, "SIGSTOP"}, {SIGTSTP, "SIGTSTP"}, {SIGTTIN, "SIGTTIN"},
      {SIGTTOU, "SIGTTOU"}, {SIGXCPU, "SIGXCPU"}, {SIGXFSZ, "SIGXFSZ"}, {SIGSYS, "SIGSYS"},
  }};
  for (const auto& [number, name] : names)
    if (number == signal_number) return std::string{name};
  return "signal " + std::to_string(signal_number);
}

}  // namespace loom::launcher

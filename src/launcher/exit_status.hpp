#pragma once

#include <signal.h>

#include <string>
#include <string_view>

namespace loom::launcher {

// How a rank ended: its exit code, or the signal that killed it.
struct exit_status {
  enum class kind { exited, killed };
  kind how = kind::exited;
  int value = 0;  // the exit code or the signal number

  [[nodiscard]] static exit_status from(const siginfo_t& child_info);
  [[nodiscard]] bool success() const { return how == kind::exited && value == 0; }
  // Stopped on purpose to be resumed, as loom::train does on SIGTERM or SIGUSR1 (loom/train/loop.hpp).
  [[nodiscard]] bool resumable() const { return how == kind::exited && value == resumable_code; }
  static constexpr int resumable_code = 75;  // EX_TEMPFAIL
  // "exited with code 3", "killed by signal 9 (SIGKILL)"
  [[nodiscard]] std::string describe() const;
};

// "SIGTERM"; "signal 42" for one without a portable name.
[[nodiscard]] std::string signal_name(int signal_number);

}  // namespace loom::launcher

#pragma once

#include "c10d_warnings.hpp"

#include <optional>
#include <string>
#include <string_view>

namespace loom::launcher {

// Re-emits one output stream of one rank as whole lines behind a prefix, each line in a
// single write, so that lines of different ranks never interleave mid-line.
class line_relay {
 public:
  line_relay(std::string prefix, int destination_fd);

  void feed(std::string_view bytes);  // emits every line that is now complete
  void finish();                      // emits a last line that lacked its newline

  // From now on, c10d's warning records are held back (while the launcher stops the rank).
  void leave_out_c10d_warnings();
  [[nodiscard]] std::size_t left_out() const noexcept { return filter_ ? filter_->matched() : 0; }

 private:
  // A line longer than this is emitted in pieces, so a rank that never prints a newline
  // cannot make the launcher buffer without bound.
  static constexpr std::size_t max_pending = 1 << 20;

  std::string prefix_;
  int destination_;
  std::string pending_;  // the incomplete line so far
  std::optional<c10d_warning_filter> filter_;
};

}  // namespace loom::launcher

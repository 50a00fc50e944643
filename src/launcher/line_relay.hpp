#pragma once

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

 private:
  // A line longer than this is emitted in pieces, so a rank that never prints a newline
  // cannot make the launcher buffer without bound.
  static constexpr std::size_t max_pending = 1 << 20;

  std::string prefix_;
  int destination_;
  std::string pending_;  // the incomplete line so far
};

}  // namespace loom::launcher

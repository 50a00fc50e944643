#pragma once

#include <cstddef>
#include <string_view>

namespace loom::launcher {

// Recognises c10d's warning records in a rank's output: a c10 log line ("[W1203 11:55:53.593908036
// TCPStore.cpp:106] [c10d] sendBytes failed ...") and what continues it (the quoted exception's
// "Exception raised from ..." line, its backtrace frames, the blank line that ends it). A rank being
// stopped prints them as its connections to the failed rank break: consequences of a failure that
// loom-run has already reported.
class c10d_warning_filter {
 public:
  // Whether the line (without its newline) belongs to such a record; counts the ones that do.
  bool matches(std::string_view line);
  [[nodiscard]] std::size_t matched() const noexcept { return matched_; }

 private:
  bool in_record_ = false;
  std::size_t matched_ = 0;
};

}  // namespace loom::launcher

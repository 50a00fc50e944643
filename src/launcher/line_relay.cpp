#include "line_relay.hpp"

#include "fd_io.hpp"

namespace loom::launcher {

line_relay::line_relay(std::string prefix, int destination_fd)
    : prefix_{std::move(prefix)}, destination_{destination_fd} {}

void line_relay::feed(std::string_view bytes) {
  std::string ready;  // every complete line of this chunk, written at once
  while (!bytes.empty()) {
    const std::size_t newline = bytes.find('\n');
    if (newline == std::string_view::npos) {
      pending_.append(bytes);
      break;
    }
    pending_.append(bytes.substr(0, newline));
    if (!filter_ || !filter_->matches(pending_)) {
      ready += prefix_;
      ready += pending_;
      ready += '\n';
    }
    pending_.clear();
    bytes.remove_prefix(newline + 1);
  }
  if (pending_.size() >= max_pending) {
    ready += prefix_ + pending_ + '\n';
    pending_.clear();
  }
  write_all(destination_, ready);
}

void line_relay::leave_out_c10d_warnings() {
  if (!filter_) filter_.emplace();
}

void line_relay::finish() {
  if (pending_.empty()) return;
  write_all(destination_, prefix_ + pending_ + '\n');
  pending_.clear();
}

}  // namespace loom::launcher

#include <loom/data/read_ahead.hpp>

#include <utility>

namespace loom::data {

read_ahead::read_ahead(text_dataset dataset, std::size_t depth)
    : dataset_(std::move(dataset)), depth_(depth == 0 ? 1 : depth), state_(dataset_.state()) {
  start();
}

read_ahead::~read_ahead() { stop(); }

void read_ahead::start() {
  stopping_ = false;
  reader_ = std::thread([this] { read(); });
}

void read_ahead::stop() {
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (reader_.joinable()) reader_.join();
}

// The reader: fills ready_ up to depth_ sequences, each with the dataset's state after it; an error
// is queued in its place and ends the reading.
void read_ahead::read() {
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return stopping_ || ready_.size() < depth_; });
      if (stopping_) return;
    }
    item next_item;
    try {
      next_item.sequence = dataset_.next();
      next_item.state_after = dataset_.state();
    } catch (...) {
      next_item.error = std::current_exception();
    }
    const bool failed = next_item.error != nullptr;
    {
      const std::lock_guard lock(mutex_);
      ready_.push_back(std::move(next_item));
    }
    changed_.notify_all();
    if (failed) return;
  }
}

std::vector<std::int32_t> read_ahead::next() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return !ready_.empty(); });
  if (ready_.front().error) std::rethrow_exception(ready_.front().error);  // kept: every later call says it again
  item taken = std::move(ready_.front());
  ready_.pop_front();
  state_ = std::move(taken.state_after);
  lock.unlock();
  changed_.notify_all();
  return std::move(taken.sequence);
}

std::string read_ahead::state() const {
  const std::lock_guard lock(mutex_);
  return state_;
}

const std::string& read_ahead::identity() const noexcept { return dataset_.identity(); }

void read_ahead::restore(std::string_view state) {
  stop();
  ready_.clear();
  dataset_.restore(state_);  // what was read ahead is dropped: back to the position next() left
  try {
    dataset_.restore(state);
  } catch (...) {
    start();  // a state refused leaves the reading where it was
    throw;
  }
  state_ = dataset_.state();
  start();
}

}  // namespace loom::data

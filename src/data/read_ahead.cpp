#include <loom/data/read_ahead.hpp>

#include <utility>

namespace loom::data {

template <class Dataset>
basic_read_ahead<Dataset>::basic_read_ahead(Dataset dataset, std::size_t depth)
    : dataset_(std::move(dataset)), depth_(depth == 0 ? 1 : depth), state_(dataset_.state()) {
  start();
}

template <class Dataset>
basic_read_ahead<Dataset>::~basic_read_ahead() {
  stop();
}

template <class Dataset>
void basic_read_ahead<Dataset>::start() {
  stopping_ = false;
  reader_ = std::thread([this] { read(); });
}

template <class Dataset>
void basic_read_ahead<Dataset>::stop() {
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (reader_.joinable()) reader_.join();
}

// The reader: fills ready_ up to depth_ sequences, each with the dataset's state after it; an error
// is queued in its place and ends the reading.
template <class Dataset>
void basic_read_ahead<Dataset>::read() {
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return stopping_ || ready_.size() < depth_; });
      if (stopping_) return;
    }
    item next_item;
    try {
      next_item.read = dataset_.next();
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

template <class Dataset>
typename basic_read_ahead<Dataset>::sequence basic_read_ahead<Dataset>::next() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return !ready_.empty(); });
  if (ready_.front().error) std::rethrow_exception(ready_.front().error);  // kept: every later call says it again
  item taken = std::move(ready_.front());
  ready_.pop_front();
  state_ = std::move(taken.state_after);
  lock.unlock();
  changed_.notify_all();
  return std::move(taken.read);
}

template <class Dataset>
std::string basic_read_ahead<Dataset>::state() const {
  const std::lock_guard lock(mutex_);
  return state_;
}

template <class Dataset>
const std::string& basic_read_ahead<Dataset>::identity() const noexcept {
  return dataset_.identity();
}

template <class Dataset>
void basic_read_ahead<Dataset>::restore(std::string_view state) {
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

template class basic_read_ahead<text_dataset>;
template class basic_read_ahead<chat_dataset>;

}  // namespace loom::data

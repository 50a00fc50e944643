#pragma once
// loom::data::read_ahead: a dataset read on a thread of its own, `depth` sequences ahead of the
// training step, so that reading, rendering and tokenizing overlap the step instead of adding to it.
// next() gives the sequences in the dataset's own order; state() is the position after the last
// sequence next() gave (not after those read ahead), so a checkpoint's position is the one its step
// used; an error of the reader (bad input) comes out of next() at the place in the stream where it
// happened. read_ahead reads a text_dataset; basic_read_ahead<chat_dataset> a chat_dataset. The
// dataset is the reader thread's once given: ask it what it is (summary(), records()) before.

#include <loom/data/chat_dataset.hpp>
#include <loom/data/text_dataset.hpp>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

namespace loom::data {

// Defined in read_ahead.cpp for text_dataset and chat_dataset.
template <class Dataset>
class basic_read_ahead {
 public:
  using sequence = decltype(std::declval<Dataset&>().next());

  explicit basic_read_ahead(Dataset dataset, std::size_t depth = 4);
  basic_read_ahead(const basic_read_ahead&) = delete;
  basic_read_ahead& operator=(const basic_read_ahead&) = delete;
  ~basic_read_ahead();

  [[nodiscard]] sequence next();
  [[nodiscard]] std::string state() const;
  // The dataset's identity() (set once, as it was indexed: safe beside the reading thread).
  [[nodiscard]] const std::string& identity() const noexcept;
  // Stops the reader, restores the dataset's position and reads ahead from there.
  void restore(std::string_view state);

 private:
  struct item {
    sequence read;
    std::string state_after;
    std::exception_ptr error;
  };
  void start();
  void stop();
  void read();

  Dataset dataset_;
  std::size_t depth_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<item> ready_;
  std::string state_;  // after the last sequence next() gave
  bool stopping_ = false;
  std::thread reader_;
};

using read_ahead = basic_read_ahead<text_dataset>;

extern template class basic_read_ahead<text_dataset>;
extern template class basic_read_ahead<chat_dataset>;

}  // namespace loom::data

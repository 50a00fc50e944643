#pragma once
// loom::data::read_ahead: a text_dataset read on a thread of its own, `depth` sequences ahead of the
// training step, so that reading and tokenizing overlap the step instead of adding to it. next()
// gives the sequences in the dataset's own order; state() is the position after the last sequence
// next() gave (not after those read ahead), so a checkpoint's position is the one its step used; an
// error of the reader (bad input) comes out of next() at the place in the stream where it happened.

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
#include <vector>

namespace loom::data {

class read_ahead {
 public:
  explicit read_ahead(text_dataset dataset, std::size_t depth = 4);
  read_ahead(const read_ahead&) = delete;
  read_ahead& operator=(const read_ahead&) = delete;
  ~read_ahead();

  [[nodiscard]] std::vector<std::int32_t> next();
  [[nodiscard]] std::string state() const;
  // The dataset's identity() (set once, as it was indexed: safe beside the reading thread).
  [[nodiscard]] const std::string& identity() const noexcept;
  // Stops the reader, restores the dataset's position and reads ahead from there.
  void restore(std::string_view state);

 private:
  struct item {
    std::vector<std::int32_t> sequence;
    std::string state_after;
    std::exception_ptr error;
  };
  void start();
  void stop();
  void read();

  text_dataset dataset_;
  std::size_t depth_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<item> ready_;
  std::string state_;  // after the last sequence next() gave
  bool stopping_ = false;
  std::thread reader_;
};

}  // namespace loom::data

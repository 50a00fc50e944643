#pragma once
// Checksums of the files loom writes and reads back (checkpoints): XXH3-64, streamed. It runs at
// memory speed (docs/checkpoints.md measures it against writing the bytes), so it is computed while
// a file is written and while it is read, at no extra pass over the bytes; its 64 bits make an
// accidental match of a damaged or swapped file a chance of one in 1.8e19. It is not a defence
// against someone who forges files on purpose.

#include <cstddef>
#include <cstdint>
#include <memory>

namespace loom {

// A file's length and XXH3-64 of its bytes.
struct file_digest {
  std::uint64_t bytes = 0;
  std::uint64_t xxh3 = 0;
  friend bool operator==(const file_digest&, const file_digest&) = default;
};

// XXH3-64 of everything given to update(), in order.
class xxh3_stream {
 public:
  xxh3_stream();
  ~xxh3_stream();
  xxh3_stream(xxh3_stream&&) noexcept;
  xxh3_stream& operator=(xxh3_stream&&) noexcept;

  void update(const void* data, std::size_t bytes);
  // The length and hash of what was given so far; more may follow.
  [[nodiscard]] file_digest digest() const;

 private:
  struct state;
  std::unique_ptr<state> state_;
  std::uint64_t bytes_ = 0;
};

// XXH3-64 of one buffer.
[[nodiscard]] std::uint64_t xxh3_of(const void* data, std::size_t bytes);

}  // namespace loom

#pragma once
// Files written so that a crash never leaves a half-written one under its final name: the bytes go
// to a temporary file beside it, which is flushed to disk and then renamed over the final name, and
// the folder is flushed so that the rename itself survives a power cut.

#include <loom/io/checksum.hpp>

#include <cstddef>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace loom {

// A file that could not be read or written: names it and the system's reason.
class file_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class atomic_file {
 public:
  // Opens `<path>.tmp` for writing; throws file_error when it cannot.
  explicit atomic_file(std::filesystem::path path);
  ~atomic_file();  // removes the temporary file unless committed
  atomic_file(const atomic_file&) = delete;
  atomic_file& operator=(const atomic_file&) = delete;

  void write(const void* data, std::size_t bytes);
  // fsync, rename over the final name, fsync the folder.
  void commit();
  // The length and XXH3-64 of what was written so far.
  [[nodiscard]] file_digest digest() const { return checksum_.digest(); }

 private:
  std::filesystem::path path_;
  std::filesystem::path temporary_;
  int fd_ = -1;
  xxh3_stream checksum_;
};

// Flushes a folder's entries (a rename, a new file) to disk.
void sync_directory(const std::filesystem::path& directory);

// "loom: could not <what> '<path>': <the system's reason for errno>"
[[nodiscard]] file_error file_error_from_errno(const std::string& what, const std::filesystem::path& path);

}  // namespace loom

#include <loom/io/files.hpp>

#include <loom/base/text.hpp>
#include <loom/runtime/failpoints.hpp>

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include <fcntl.h>
#include <unistd.h>

namespace loom {

file_error file_error_from_errno(const std::string& what, const std::filesystem::path& path) {
  return file_error(error_message("could not {} '{}': {}", what, path.string(), std::strerror(errno)));
}

atomic_file::atomic_file(std::filesystem::path path) : path_(std::move(path)) {
  temporary_ = path_;
  temporary_ += ".tmp";
  fd_ = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw file_error_from_errno("create", temporary_);
}

atomic_file::~atomic_file() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(temporary_.c_str());
  }
}

void atomic_file::write(const void* data, std::size_t bytes) {
  checksum_.update(data, bytes);
  const auto* next = static_cast<const char*>(data);
  while (bytes > 0) {
    const ::ssize_t written = ::write(fd_, next, bytes);
    if (written < 0 && errno == EINTR) continue;
    if (written < 0) throw file_error_from_errno("write", temporary_);
    next += written;
    bytes -= static_cast<std::size_t>(written);
  }
}

void atomic_file::commit() {
  // A full disk often shows only here, when the file system allocates the blocks.
  if (const int injected = injected_error("file.commit"); injected != 0) {
    errno = injected;
    throw file_error_from_errno("flush", temporary_);
  }
  if (::fsync(fd_) != 0) throw file_error_from_errno("flush", temporary_);
  if (::close(std::exchange(fd_, -1)) != 0) {
    ::unlink(temporary_.c_str());
    throw file_error_from_errno("close", temporary_);
  }
  if (::rename(temporary_.c_str(), path_.c_str()) != 0) {
    const file_error error = file_error_from_errno("rename " + temporary_.string() + " to", path_);
    ::unlink(temporary_.c_str());
    throw error;
  }
  sync_directory(path_.has_parent_path() ? path_.parent_path() : std::filesystem::path("."));
}

void sync_directory(const std::filesystem::path& directory) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw file_error_from_errno("open the folder", directory);
  const int synced = ::fsync(fd);
  ::close(fd);
  if (synced != 0) throw file_error_from_errno("flush the folder", directory);
}

}  // namespace loom

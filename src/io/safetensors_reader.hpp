#pragma once
// The safetensors reader behind load_safetensors and pretrained(...) (src/io, not public): the
// header read and checked once, as loom/io/safetensors.hpp promises, and each tensor's bytes read
// when it is asked for, so that a caller copying a checkpoint into a model holds one tensor of it
// at a time rather than all of them.

#include <loom/io/checksum.hpp>
#include <loom/io/weights.hpp>
#include <loom/runtime/tensors.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace loom::io_detail {

class safetensors_reader {
 public:
  struct entry {
    tensor_spec spec;
    std::uint64_t begin = 0;  // in the data, which starts after the header
    std::uint64_t end = 0;
  };

  // Opens `path` and reads and checks its header; safetensors_error (or file_error) naming the file
  // and its first problem.
  explicit safetensors_reader(std::filesystem::path path);

  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  // In the order of their bytes in the file.
  [[nodiscard]] const std::vector<entry>& entries() const noexcept { return entries_; }
  [[nodiscard]] const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }
  // The tensor's bytes, read now into a new CPU tensor.
  [[nodiscard]] at::Tensor read(const entry& e);
  // The length and XXH3-64 of the header and of the tensors read() so far, in order: the whole
  // file's once every entry was read in turn.
  [[nodiscard]] file_digest digest() const { return checksum_.digest(); }
  // XXH3-64 of the header and of samples of every tensor's bytes: its start, middle and end, 16 KiB
  // each (the whole of a tensor of 48 KiB or less). Weights retrained, reseeded or merged differ
  // throughout every tensor that changed, so a few KiB a tensor tell them from others of the same
  // names and shapes without a pass over the file. Not counted in bytes_read(), nor in digest().
  [[nodiscard]] std::uint64_t sampled_digest();
  // Rows [first, first + count) of it (its dim 0; a 0-d tensor is one row), read alone.
  [[nodiscard]] at::Tensor read_rows(const entry& e, std::int64_t first, std::int64_t count);
  // Rows [first, first + count) of `slice` of it, read alone: one read a run of contiguous bytes.
  [[nodiscard]] at::Tensor read_slice_rows(const entry& e, const tensor_slice& slice, std::int64_t first,
                                           std::int64_t count);
  // The bytes read so far.
  [[nodiscard]] std::uint64_t bytes_read() const noexcept { return bytes_read_; }

 private:
  std::filesystem::path path_;
  std::ifstream in_;
  std::uint64_t data_start_ = 0;
  std::uint64_t bytes_read_ = 0;
  std::vector<entry> entries_;
  std::map<std::string, std::string> metadata_;
  // Reads `bytes` at `offset` of the data into `into`.
  void read_at(const entry& e, std::uint64_t offset, void* into, std::uint64_t bytes);
  xxh3_stream checksum_;
  std::uint64_t header_xxh3_ = 0;  // of the header's length and text
};

}  // namespace loom::io_detail

#pragma once
// safetensors (https://github.com/huggingface/safetensors), the tensor file that Hugging Face's
// libraries, PEFT and PyTorch users read: an 8-byte little-endian header length, a JSON header that
// gives each tensor's dtype, shape and byte range, then the bytes. LibTorch has no C++ support.
//
// The reader trusts nothing it reads: the header's length within the file, known dtypes, byte
// sizes equal to shape × dtype, byte ranges in bounds, contiguous and covering the data, no name
// twice. A bad file is a safetensors_error naming the file and its first problem, never a crash or
// a read past the end.

#include <loom/io/checksum.hpp>
#include <loom/runtime/tensors.hpp>

#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace loom {

class safetensors_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct safetensors_content {
  std::vector<named_tensor> tensors;  // in the order of their bytes in the file
  std::map<std::string, std::string> metadata;
  file_digest digest;  // of the whole file, as read
};

// Writes `tensors` (any device; copied to the CPU) atomically (loom/io/files.hpp), in the given
// order; names must be unique. Returns the digest of the bytes written.
file_digest save_safetensors(const std::filesystem::path& path, const std::vector<named_tensor>& tensors,
                             const std::map<std::string, std::string>& metadata = {});

[[nodiscard]] safetensors_content load_safetensors(const std::filesystem::path& path);

// The dtype's name in safetensors ("F32", "BF16", ...); safetensors_error for one it lacks.
[[nodiscard]] std::string safetensors_dtype(c10::ScalarType dtype);

}  // namespace loom

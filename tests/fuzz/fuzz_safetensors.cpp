// libFuzzer target: the safetensors reader (src/io/safetensors.cpp). The input is the file; each
// must be read or rejected with a safetensors_error (one sentence naming the file), nothing else.
#include <loom/io/safetensors.hpp>

#include <unistd.h>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("loom-fuzz-safetensors-" + std::to_string(::getpid()));
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  try {
    (void)loom::load_safetensors(path);
  } catch (const loom::safetensors_error&) {
  }
  return 0;
}

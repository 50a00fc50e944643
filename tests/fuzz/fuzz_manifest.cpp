// libFuzzer target: the checkpoint manifest reader (read_checkpoint_manifest, in
// src/checkpoint/manifest.cpp). The input is step-00000004/manifest.json; the folder holds two
// rank files of 64 bytes each, written once, which the corpus's manifests list. Each input must be
// read or rejected with a checkpoint_error, nothing else.
#include <loom/checkpoint/checkpoint.hpp>

#include <unistd.h>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace {

std::filesystem::path checkpoint_folder() {
  const std::filesystem::path folder =
      std::filesystem::temp_directory_path() / ("loom-fuzz-manifest-" + std::to_string(::getpid())) / "step-00000004";
  std::filesystem::create_directories(folder);
  for (const char* name : {"rank-00000.safetensors", "rank-00001.safetensors"}) {
    std::ofstream(folder / name, std::ios::binary | std::ios::trunc) << std::string(64, '\0');
  }
  return folder;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::filesystem::path folder = checkpoint_folder();
  std::ofstream(folder / "manifest.json", std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  try {
    (void)loom::read_checkpoint_manifest(folder);
  } catch (const loom::checkpoint_error&) {
  }
  return 0;
}

// libFuzzer target: the run-file reader (src/config/run_file.cpp), TOML, JSON and YAML (FastVideo's
// layout included, src/config/fastvideo_layout.cpp). The first byte
// chooses the format, the rest is the file; each input must be read or rejected with a
// run_file_error or the DSL's plan_error (a rule's sentence), nothing else.
#include <loom/config/run_file.hpp>

#include <unistd.h>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  static const std::string base =
      (std::filesystem::temp_directory_path() / ("loom-fuzz-run-file-" + std::to_string(::getpid()))).string();
  static constexpr const char* extensions[] = {".json", ".toml", ".yaml"};
  const std::filesystem::path path = base + extensions[data[0] % 3];
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data + 1), static_cast<std::streamsize>(size - 1));
  try {
    (void)loom::read_run_stages(path);
    (void)loom::read_train_options(path);
    (void)loom::read_run_file(path);  // flow_matching too, and the ranks FastVideo's sizes ask for
  } catch (const loom::run_file_error&) {
  } catch (const loom::plan_error&) {
  }
  return 0;
}

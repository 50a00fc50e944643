// libFuzzer target: the PEFT adapter_config.json reader (src/io/peft.cpp). The input is the config;
// the folder's adapter_model.safetensors is a fixed valid one, written once, so each input reaches
// the config's checks. Each must be read or rejected with a peft_error, nothing else.
#include <loom/io/peft.hpp>
#include <loom/io/safetensors.hpp>

#include <ATen/ATen.h>

#include <unistd.h>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace {

std::filesystem::path adapter_folder() {
  const std::filesystem::path folder =
      std::filesystem::temp_directory_path() / ("loom-fuzz-peft-config-" + std::to_string(::getpid()));
  std::filesystem::create_directories(folder);
  loom::save_safetensors(folder / "adapter_model.safetensors",
                         {{"base_model.model.layers.0.q_proj.lora_A.weight", at::zeros({2, 4})},
                          {"base_model.model.layers.0.q_proj.lora_B.weight", at::zeros({4, 2})}},
                         {{"format", "pt"}});
  return folder;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::filesystem::path folder = adapter_folder();
  std::ofstream(folder / "adapter_config.json", std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  try {
    (void)loom::load_peft_adapter(folder);
  } catch (const loom::peft_error&) {
  }
  return 0;
}

#pragma once
// A model's weights as safetensors, the way Hugging Face stores them: one model.safetensors, or a
// sharded set of model-0000i-of-0000n.safetensors files with model.safetensors.index.json mapping
// each tensor to its file.

#include <loom/runtime/tensors.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace loom {

inline constexpr std::int64_t default_max_shard_bytes = std::int64_t{5} << 30;  // as save_pretrained's "5GB"

// Writes `tensors` into `folder` (created if missing): model.safetensors when they fit in one shard
// of `max_shard_bytes`, otherwise numbered shards and the index. Each file is written atomically,
// the index last.
void save_weights(const std::filesystem::path& folder, const std::vector<named_tensor>& tensors,
                  std::int64_t max_shard_bytes = default_max_shard_bytes);

// Reads a .safetensors file, a model.safetensors.index.json, or a folder holding either; every
// tensor the index names must be in the file it names.
[[nodiscard]] std::vector<named_tensor> load_weights(const std::filesystem::path& path);

// Copies `weights` into the module's parameters and buffers of the same names, leaving out those
// that `skip(name)` selects (LoRA adapters). Strict: every other tensor of the module must be in
// `weights`, and nothing else; otherwise std::invalid_argument lists the missing and the unexpected
// names. Not strict: copies what matches and returns the names it left alone. A tensor of another
// shape or dtype is an error either way, and nothing is copied before everything is checked.
struct weights_report {
  std::vector<std::string> missing;     // the module has them, `weights` does not
  std::vector<std::string> unexpected;  // `weights` has them, the module does not
};
weights_report copy_weights(torch::nn::Module& module, const std::vector<named_tensor>& weights, bool strict,
                            bool (*skip)(std::string_view name));

// The plan's pretrained(path), while the model is built: the weights at `path` (as load_weights
// reads them) copied in by name, strictly, each floating tensor first cast to the dtype of the one it
// fills (as from_pretrained casts a checkpoint to the model's dtype). Returns how many it copied.
std::size_t load_pretrained(torch::nn::Module& module, const std::filesystem::path& path);

}  // namespace loom

#pragma once
// A model's weights as safetensors, the way Hugging Face stores them: one model.safetensors, or a
// sharded set of model-0000i-of-0000n.safetensors files with model.safetensors.index.json mapping
// each tensor to its file (diffusers' diffusion_pytorch_model.safetensors and its index are read too).

#include <loom/runtime/tensors.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace torch::nn {
class Module;
}

namespace loom {

inline constexpr std::int64_t default_max_shard_bytes = std::int64_t{5} << 30;  // as save_pretrained's "5GB"

// Whose file names a model's weights take, as each library's from_pretrained looks for them:
// transformers' (model.safetensors, model-0000i-of-0000n.safetensors and model.safetensors.index.json)
// or diffusers' (the same with diffusion_pytorch_model for model).
enum class weights_naming { transformers, diffusers };

// Writes `tensors` into `folder` (created if missing): model.safetensors when they fit in one shard
// of `max_shard_bytes`, otherwise numbered shards and the index, under `naming`'s names. Each file is
// written atomically, the index last.
void save_weights(const std::filesystem::path& folder, const std::vector<named_tensor>& tensors,
                  std::int64_t max_shard_bytes = default_max_shard_bytes,
                  weights_naming naming = weights_naming::transformers);

// Reads a .safetensors file, an index, or a folder holding either (model.safetensors and its
// index, or diffusers' diffusion_pytorch_model.safetensors and its index); every tensor the index
// names must be in the file it names.
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

// The files of a Hugging Face model folder that are not its weights (config.json,
// generation_config.json, the tokenizer's; a diffusers pipeline's model_index.json and its
// scheduler's scheduler_config.json), copied from `from` into `to` where they exist: what
// save_pretrained writes beside the weights. The names copied.
std::vector<std::string> copy_model_files(const std::filesystem::path& from, const std::filesystem::path& to);

// A diffusers pipeline's folder `from` (model_index.json) copied into `to` but for the components in
// `written`, whose weights the caller writes: model_index.json, and each other component it names
// whole (the scheduler's config, a text encoder's or a VAE's weights), so that `to` loads as the
// pipeline did. The components copied whole. Throws std::invalid_argument naming the file when
// model_index.json is missing or not a JSON object.
std::vector<std::string> copy_pipeline_files(const std::filesystem::path& from, const std::filesystem::path& to,
                                             const std::vector<std::string>& written);

// What tells pretrained weights from others of the same names and shapes: where the plan read them,
// and pretrained_checkpoint::fingerprint()'s digest of their files, which every rank computes alike.
struct weights_fingerprint {
  std::filesystem::path path;
  std::uint64_t digest = 0;
};

// The part of a tensor one rank of a split layer keeps (tensor_parallel): elements [first, first +
// count) of dimension `dim`, every index of the others.
struct tensor_slice {
  std::int64_t dim = 0;
  std::int64_t first = 0;
  std::int64_t count = 0;
};

// The plan's pretrained(path): a checkpoint (a .safetensors file, an index or a folder holding
// either, under transformers' names or diffusers') opened with every file's header read and checked and no tensor yet;
// its tensors are read on demand, whole or by rows, so that a rank reads only what it keeps.
//
// A model made of a pipeline's components (a model type's static pretrained_components: Wan 2.2
// A14B's {"transformer", "transformer_2"}) reads a diffusers pipeline's folder: each component's
// checkpoint in path/<component>/, its tensors named "<component>.<name in its files>", so that the
// model's transformer_2.blocks.0.attn1.to_q.weight is transformer_2/'s blocks.0.attn1.to_q.weight.
class pretrained_checkpoint {
 public:
  // `components` empty: `path` is the checkpoint. Otherwise `path` is the pipeline's folder, and a
  // component without a folder there is refused (std::invalid_argument naming it).
  explicit pretrained_checkpoint(const std::filesystem::path& path, std::span<const std::string_view> components = {});
  ~pretrained_checkpoint();
  pretrained_checkpoint(const pretrained_checkpoint&) = delete;
  pretrained_checkpoint& operator=(const pretrained_checkpoint&) = delete;

  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  // Whose names its files have: diffusers' when it is diffusion_pytorch_model.safetensors or its index.
  [[nodiscard]] weights_naming naming() const noexcept;
  [[nodiscard]] std::size_t size() const noexcept;
  [[nodiscard]] std::uint64_t total_bytes() const noexcept;
  [[nodiscard]] std::uint64_t bytes_read() const noexcept;
  // Whether it holds a tensor called `name`.
  [[nodiscard]] bool holds(const std::string& name) const noexcept;
  // Every tensor's name, shape and dtype, as its file's header gives them.
  [[nodiscard]] std::vector<tensor_spec> specs() const;
  // XXH3-64 over every file's name (with its component's folder, for a pipeline's), header and
  // samples of each tensor's bytes (a few KiB a tensor, whatever rows this rank reads;
  // src/io/safetensors_reader.hpp): what a training checkpoint records of the weights it was trained
  // over. Reads the samples on each call.
  [[nodiscard]] weights_fingerprint fingerprint();

  // The module's parameters and buffers against the checkpoint, before a byte of it is read: the
  // same names (strict), the same shapes, the same dtype or both floating (a floating tensor is
  // converted as it is copied, as from_pretrained casts to the model's dtype), leaving out those
  // `skip` selects (LoRA's adapters, once injected). std::invalid_argument naming the tensor, or the
  // missing and unexpected names.
  void check(torch::nn::Module& module, bool (*skip)(std::string_view name) = nullptr) const;
  // Every tensor copied into the module's tensor of its name, read one at a time (checked first).
  void copy_into(torch::nn::Module& module, bool (*skip)(std::string_view name) = nullptr);
  // `name` whole, or its rows [first, first + count) (dim 0; a 0-d tensor is one row), in its own dtype.
  [[nodiscard]] at::Tensor read(const std::string& name);
  [[nodiscard]] at::Tensor read_rows(const std::string& name, std::int64_t first, std::int64_t count);
  // From now on the named tensors are their slices: specs(), check, copy_into, read and read_rows give
  // and read the slice alone (rows of it, for read_rows), so that a rank of a split layer reads its part
  // and no more. std::invalid_argument when a name is not in the checkpoint or a slice exceeds its tensor.
  void read_slices(const std::map<std::string, tensor_slice>& slices);

 private:
  struct files;
  friend std::vector<named_tensor> load_weights(const std::filesystem::path& path);  // reads them all
  std::filesystem::path path_;
  std::unique_ptr<files> files_;
};

}  // namespace loom

#include <loom/io/weights.hpp>

#include "safetensors_reader.hpp"

#include <loom/base/text.hpp>
#include <loom/io/files.hpp>
#include <loom/io/safetensors.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/module.h>
#include <torch/types.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <stdexcept>
#include <string_view>

namespace loom {
namespace {

using json = nlohmann::json;

// What every weight file's name starts with: transformers' PreTrainedModel.save_pretrained writes
// model.safetensors, diffusers' ModelMixin.save_pretrained diffusion_pytorch_model.safetensors.
std::string_view stem(weights_naming naming) {
  return naming == weights_naming::diffusers ? "diffusion_pytorch_model" : "model";
}
std::string single_file(weights_naming naming) { return fmt::format("{}.safetensors", stem(naming)); }
std::string index_file(weights_naming naming) { return fmt::format("{}.safetensors.index.json", stem(naming)); }

constexpr std::array namings{weights_naming::transformers, weights_naming::diffusers};

}  // namespace

// The safetensors files of a checkpoint (one file, or an index's shards; or those of each of a
// pipeline's components), their headers read and checked, each tensor's bytes read only when it is
// asked for.
struct pretrained_checkpoint::files {
  struct source {
    io_detail::safetensors_reader* file;
    const io_detail::safetensors_reader::entry* entry;
    std::string name;  // the model's: the file's, under its component's prefix
  };
  struct opened {
    std::unique_ptr<io_detail::safetensors_reader> reader;
    std::string label;  // its name as the fingerprint hashes it
  };

  // A .safetensors file, an index, or a folder holding either (transformers' names, or diffusers');
  // with `components`, a pipeline's folder: each component's checkpoint in its folder, its names
  // under the component's prefix.
  files(const std::filesystem::path& path, std::span<const std::string_view> components) {
    if (components.empty()) open_checkpoint(path);
    for (const std::string_view component : components) {
      const std::filesystem::path folder = path / component;
      if (!std::filesystem::is_directory(folder)) {
        throw_error<std::invalid_argument>(
            "pretrained(\"{}\"): the model reads each of a pipeline's components ({}) from its folder, and '{}' is "
            "not a folder: give the pipeline's folder, which holds one folder a component",
            path.string(), fmt::join(components, ", "), folder.string());
      }
      prefix = fmt::format("{}.", component);
      folder_label = fmt::format("{}/", component);
      open_folder(folder);
    }
    for (std::size_t i = 0; i < sources.size(); ++i) by_name.emplace(sources[i].name, i);
  }

  void open_checkpoint(const std::filesystem::path& path) {
    if (std::filesystem::is_directory(path)) {
      open_folder(path);
    } else if (path.filename() == "config.json") {
      throw_error<std::invalid_argument>(
          "'{}' is the model's config, not its weights: give the folder that holds it and the weights, '{}'",
          path.string(), path.parent_path().string());
    } else {
      naming = path.filename().string().starts_with(stem(weights_naming::diffusers)) ? weights_naming::diffusers
                                                                                     : weights_naming::transformers;
      if (path.extension() == ".json") {
        open_index(path);
      } else {
        open_file(path);
      }
    }
  }

  // transformers' index or file, else diffusers'.
  void open_folder(const std::filesystem::path& folder) {
    for (const weights_naming candidate : namings) {
      naming = candidate;
      if (std::filesystem::exists(folder / index_file(naming))) {
        open_index(folder / index_file(naming));
        return;
      }
      if (std::filesystem::exists(folder / single_file(naming))) {
        open_file(folder / single_file(naming));
        return;
      }
    }
    throw_error<std::invalid_argument>("'{}' holds none of {}, {}, {} and {}", folder.string(),
                                       single_file(weights_naming::transformers),
                                       index_file(weights_naming::transformers), single_file(weights_naming::diffusers),
                                       index_file(weights_naming::diffusers));
  }

  // Every tensor, file by file, each in the order of its bytes.
  [[nodiscard]] const std::vector<source>& tensors() const noexcept { return sources; }
  // As read() gives them: a sliced tensor's spec is its slice's.
  [[nodiscard]] std::vector<tensor_spec> specs() const {
    std::vector<tensor_spec> specs;
    for (const source& s : sources) {
      tensor_spec& spec = specs.emplace_back(s.entry->spec);
      spec.name = s.name;
      if (const tensor_slice* slice = slice_of(spec.name))
        spec.shape[static_cast<std::size_t>(slice->dim)] = slice->count;
    }
    return specs;
  }
  [[nodiscard]] at::Tensor read(const source& s) const {
    const tensor_slice* slice = slice_of(s.name);
    if (slice == nullptr) return s.file->read(*s.entry);
    return s.file->read_slice_rows(*s.entry, *slice, 0, slice->dim == 0 ? slice->count : s.entry->spec.shape.front());
  }
  [[nodiscard]] at::Tensor read_rows(const source& s, std::int64_t first, std::int64_t count) const {
    const tensor_slice* slice = slice_of(s.name);
    return slice == nullptr ? s.file->read_rows(*s.entry, first, count)
                            : s.file->read_slice_rows(*s.entry, *slice, first, count);
  }
  [[nodiscard]] const tensor_slice* slice_of(const std::string& name) const {
    const auto found = slices.find(name);
    return found == slices.end() ? nullptr : &found->second;
  }

  io_detail::safetensors_reader& open(const std::filesystem::path& file) {
    auto reader = std::make_unique<io_detail::safetensors_reader>(file);
    return *readers.emplace_back(opened{std::move(reader), folder_label + file.filename().string()}).reader;
  }

  void add(io_detail::safetensors_reader& reader, const io_detail::safetensors_reader::entry& e) {
    sources.push_back({&reader, &e, prefix + e.spec.name});
  }

  void open_file(const std::filesystem::path& file) {
    io_detail::safetensors_reader& reader = open(file);
    for (const auto& e : reader.entries()) add(reader, e);
  }

  void open_index(const std::filesystem::path& index_path) {
    std::ifstream in(index_path);
    if (!in) throw file_error_from_errno("open", index_path);
    json index;
    try {
      index = json::parse(in);
    } catch (const json::exception& error) {
      throw_error<std::invalid_argument>("'{}' is not JSON ({})", index_path.string(), error.what());
    }
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      throw_error<std::invalid_argument>("'{}' has no weight_map", index_path.string());
    }
    std::map<std::string, std::set<std::string>> names_by_file;
    for (const auto& [name, file] : index["weight_map"].items()) {
      if (!file.is_string()) {
        throw_error<std::invalid_argument>("'{}' maps '{}' to something other than a file name", index_path.string(),
                                           name);
      }
      names_by_file[file.get<std::string>()].insert(name);
    }
    for (auto& [file, names] : names_by_file) {
      const std::filesystem::path shard = index_path.parent_path() / file;
      io_detail::safetensors_reader& reader = open(shard);
      for (const auto& e : reader.entries()) {
        if (names.erase(e.spec.name) == 1) add(reader, e);
      }
      if (!names.empty()) {
        throw_error<std::invalid_argument>("'{}' puts '{}' in '{}', which does not hold it", index_path.string(),
                                           *names.begin(), shard.string());
      }
    }
  }

  // The tensor called `name`; its absence is a bug in the caller, which checked the names first.
  [[nodiscard]] const source& named(const std::string& name) const {
    const auto found = by_name.find(name);
    TORCH_INTERNAL_ASSERT(found != by_name.end(), "pretrained: no tensor '", name, "' in the checkpoint");
    return sources[found->second];
  }

  weights_naming naming = weights_naming::transformers;
  std::vector<opened> readers;
  std::vector<source> sources;
  // While a pipeline's component is opened: the prefix of its names and the folder of its files.
  std::string prefix;
  std::string folder_label;
  std::map<std::string, std::size_t> by_name;
  std::map<std::string, tensor_slice> slices;  // pretrained_checkpoint::read_slices'
};

void save_weights(const std::filesystem::path& folder, const std::vector<named_tensor>& tensors,
                  std::int64_t max_shard_bytes, weights_naming naming) {
  std::filesystem::create_directories(folder);
  std::vector<std::vector<named_tensor>> shards(1);
  std::int64_t shard_bytes = 0;
  std::int64_t total = 0;
  for (const named_tensor& t : tensors) {
    const auto bytes = static_cast<std::int64_t>(t.tensor.nbytes());
    if (!shards.back().empty() && shard_bytes + bytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(t);
    shard_bytes += bytes;
    total += bytes;
  }
  if (shards.size() == 1) {
    save_safetensors(folder / single_file(naming), shards.front(), {{"format", "pt"}});
    return;
  }
  json weight_map = json::object();
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const std::string file = fmt::format("{}-{:05}-of-{:05}.safetensors", stem(naming), i + 1, shards.size());
    save_safetensors(folder / file, shards[i], {{"format", "pt"}});
    for (const named_tensor& t : shards[i]) weight_map[t.name] = file;
  }
  const std::string index = json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2) + "\n";
  atomic_file out(folder / index_file(naming));
  out.write(index.data(), index.size());
  out.commit();
}

std::vector<named_tensor> load_weights(const std::filesystem::path& path) {
  const pretrained_checkpoint::files files(path, {});
  std::vector<named_tensor> tensors;
  for (const auto& source : files.tensors()) tensors.push_back({source.name, files.read(source)});
  return tensors;
}

namespace {

// Which of `given` (by name, shape and dtype) fills which of the module's tensors, leaving out those
// `skip` selects; checked whole, strictly or not, before anything is copied. `cast_floating`: a
// floating tensor fills a floating one of another dtype, converted as it is copied.
struct planned_copies {
  std::vector<std::pair<at::Tensor, std::size_t>> copies;  // a module's tensor, the index in `given`
  weights_report report;
};
planned_copies plan_copies(torch::nn::Module& module, const std::vector<tensor_spec>& given, bool strict,
                           bool (*skip)(std::string_view name), bool cast_floating, std::string_view who,
                           std::string_view fix) {
  std::map<std::string, std::size_t> by_name;
  for (std::size_t i = 0; i < given.size(); ++i) by_name.emplace(given[i].name, i);
  planned_copies planned;
  for (const named_tensor& target : module_state(module)) {
    if (skip && skip(target.name)) continue;
    const auto found = by_name.find(target.name);
    if (found == by_name.end()) {
      planned.report.missing.push_back(target.name);
      continue;
    }
    const tensor_spec want = target.spec();
    const tensor_spec& have = given[found->second];
    const bool converts = cast_floating && at::isFloatingType(want.dtype) && at::isFloatingType(have.dtype);
    if (want.shape != have.shape || (want.dtype != have.dtype && !converts)) {
      throw_error<std::invalid_argument>("{}: '{}' is {} in the weights but {} in the model", who, target.name,
                                         have.layout(), want.layout());
    }
    planned.copies.emplace_back(target.tensor, found->second);
    by_name.erase(found);
  }
  for (const auto& [name, index] : by_name) planned.report.unexpected.push_back(name);
  if (strict && (!planned.report.missing.empty() || !planned.report.unexpected.empty())) {
    throw_error<std::invalid_argument>("{}: the weights do not match the model: missing [{}], unexpected [{}] ({})",
                                       who, fmt::join(planned.report.missing, ", "),
                                       fmt::join(planned.report.unexpected, ", "), fix);
  }
  return planned;
}

}  // namespace

weights_report copy_weights(torch::nn::Module& module, const std::vector<named_tensor>& weights, bool strict,
                            bool (*skip)(std::string_view name)) {
  std::vector<tensor_spec> given;
  for (const named_tensor& t : weights) given.push_back({t.name, t.tensor.sizes().vec(), t.tensor.scalar_type()});
  const planned_copies planned = plan_copies(module, given, strict, skip, /*cast_floating=*/false, "load_weights",
                                             "pass strict = false to load what matches");
  torch::NoGradGuard no_grad;
  for (const auto& [destination, index] : planned.copies) at::Tensor(destination).copy_(weights[index].tensor);
  return planned.report;
}

pretrained_checkpoint::pretrained_checkpoint(const std::filesystem::path& path,
                                             std::span<const std::string_view> components)
    : path_(path), files_(std::make_unique<files>(path, components)) {}

pretrained_checkpoint::~pretrained_checkpoint() = default;

weights_naming pretrained_checkpoint::naming() const noexcept { return files_->naming; }

std::size_t pretrained_checkpoint::size() const noexcept { return files_->tensors().size(); }

std::uint64_t pretrained_checkpoint::total_bytes() const noexcept {
  std::uint64_t total = 0;
  for (const auto& source : files_->tensors()) total += source.entry->end - source.entry->begin;
  return total;
}

std::uint64_t pretrained_checkpoint::bytes_read() const noexcept {
  std::uint64_t read = 0;
  for (const auto& opened : files_->readers) read += opened.reader->bytes_read();
  return read;
}

namespace {

planned_copies plan_pretrained(torch::nn::Module& module, const std::vector<tensor_spec>& given,
                               const std::filesystem::path& path, bool (*skip)(std::string_view name)) {
  return plan_copies(module, given, /*strict=*/true, skip, /*cast_floating=*/true,
                     fmt::format("pretrained(\"{}\")", path.string()),
                     "the checkpoint must hold every parameter and buffer of the model before lora, and nothing else");
}

}  // namespace

void pretrained_checkpoint::check(torch::nn::Module& module, bool (*skip)(std::string_view name)) const {
  (void)plan_pretrained(module, files_->specs(), path_, skip);
}

// Tensor by tensor, each read from its file as it is copied: the checkpoint is never in memory whole.
void pretrained_checkpoint::copy_into(torch::nn::Module& module, bool (*skip)(std::string_view name)) {
  const planned_copies planned = plan_pretrained(module, files_->specs(), path_, skip);
  torch::NoGradGuard no_grad;
  for (const auto& [destination, index] : planned.copies) {
    at::Tensor(destination).copy_(files_->read(files_->tensors()[index]));
  }
}

std::vector<std::string> copy_model_files(const std::filesystem::path& from, const std::filesystem::path& to) {
  static constexpr std::array names{"config.json",
                                    "generation_config.json",
                                    "tokenizer.json",
                                    "tokenizer_config.json",
                                    "special_tokens_map.json",
                                    "tokenizer.model",
                                    "vocab.json",
                                    "merges.txt",
                                    "added_tokens.json",
                                    "chat_template.jinja",
                                    "model_index.json",
                                    "scheduler_config.json"};
  std::vector<std::string> copied;
  std::filesystem::create_directories(to);
  for (const char* name : names) {
    if (!std::filesystem::is_regular_file(from / name)) continue;
    std::filesystem::copy_file(from / name, to / name, std::filesystem::copy_options::overwrite_existing);
    copied.emplace_back(name);
  }
  return copied;
}

std::vector<std::string> copy_pipeline_files(const std::filesystem::path& from, const std::filesystem::path& to,
                                             const std::vector<std::string>& written) {
  const std::filesystem::path index_file = from / "model_index.json";
  std::ifstream in(index_file);
  const nlohmann::json index = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!in.is_open() || !index.is_object()) {
    throw_error<std::invalid_argument>(
        "{}: {}; give the folder of a diffusers pipeline, as its save_pretrained writes it", index_file.string(),
        in.is_open() ? "is not a JSON object" : "cannot be read");
  }
  std::filesystem::create_directories(to);
  std::filesystem::copy_file(index_file, to / "model_index.json", std::filesystem::copy_options::overwrite_existing);
  std::vector<std::string> copied;
  for (const auto& [component, entry] : index.items()) {
    // A component is ["library", "Class"]; the keys starting with "_" and the pipeline's options
    // (boundary_ratio) are not, and a component left out is [null, null].
    if (!entry.is_array() || entry.empty() || entry.front().is_null()) continue;
    if (std::find(written.begin(), written.end(), component) != written.end()) continue;
    if (!std::filesystem::is_directory(from / component)) continue;
    std::filesystem::copy(from / component, to / component,
                          std::filesystem::copy_options::recursive | std::filesystem::copy_options::overwrite_existing);
    copied.push_back(component);
  }
  return copied;
}

bool pretrained_checkpoint::holds(const std::string& name) const noexcept { return files_->by_name.contains(name); }

std::vector<tensor_spec> pretrained_checkpoint::specs() const { return files_->specs(); }

weights_fingerprint pretrained_checkpoint::fingerprint() {
  xxh3_stream digest;
  for (const auto& [reader, label] : files_->readers) {
    // The file's name, so that shards (or components) that trade places are others' weights.
    const std::uint64_t sampled = reader->sampled_digest();
    digest.update(label.data(), label.size() + 1);
    digest.update(&sampled, sizeof sampled);
  }
  return {path_, digest.digest().xxh3};
}

at::Tensor pretrained_checkpoint::read(const std::string& name) { return files_->read(files_->named(name)); }

at::Tensor pretrained_checkpoint::read_rows(const std::string& name, std::int64_t first, std::int64_t count) {
  return files_->read_rows(files_->named(name), first, count);
}

void pretrained_checkpoint::read_slices(const std::map<std::string, tensor_slice>& slices) {
  for (const auto& [name, slice] : slices) {
    if (!holds(name)) {
      throw_error<std::invalid_argument>("pretrained(\"{}\"): no tensor '{}' to read a slice of", path_.string(), name);
    }
    const std::vector<std::int64_t>& shape = files_->named(name).entry->spec.shape;
    const auto dims = static_cast<std::int64_t>(shape.size());
    if (slice.dim < 0 || slice.dim >= dims || slice.first < 0 || slice.count < 0 ||
        slice.first + slice.count > shape[static_cast<std::size_t>(slice.dim)]) {
      throw_error<std::invalid_argument>(
          "pretrained(\"{}\"): '{}' of shape [{}] has no elements [{}, {}) along dimension {}", path_.string(), name,
          fmt::join(shape, ", "), slice.first, slice.first + slice.count, slice.dim);
    }
  }
  files_->slices = slices;
}

}  // namespace loom

#include <loom/io/weights.hpp>

#include <loom/io/files.hpp>
#include <loom/io/safetensors.hpp>
#include <loom/runtime/text.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/module.h>
#include <torch/types.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <map>
#include <set>
#include <stdexcept>

namespace loom {
namespace {

using json = nlohmann::json;

constexpr const char* single_file = "model.safetensors";
constexpr const char* index_file = "model.safetensors.index.json";

std::vector<named_tensor> load_index(const std::filesystem::path& index_path) {
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
  std::vector<named_tensor> tensors;
  for (auto& [file, names] : names_by_file) {
    const std::filesystem::path shard = index_path.parent_path() / file;
    for (named_tensor& t : load_safetensors(shard).tensors) {
      if (names.erase(t.name) == 1) tensors.push_back(std::move(t));
    }
    if (!names.empty()) {
      throw_error<std::invalid_argument>("'{}' puts '{}' in '{}', which does not hold it", index_path.string(),
                                         *names.begin(), shard.string());
    }
  }
  return tensors;
}

}  // namespace

void save_weights(const std::filesystem::path& folder, const std::vector<named_tensor>& tensors,
                  std::int64_t max_shard_bytes) {
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
    save_safetensors(folder / single_file, shards.front(), {{"format", "pt"}});
    return;
  }
  json weight_map = json::object();
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const std::string file = fmt::format("model-{:05}-of-{:05}.safetensors", i + 1, shards.size());
    save_safetensors(folder / file, shards[i], {{"format", "pt"}});
    for (const named_tensor& t : shards[i]) weight_map[t.name] = file;
  }
  const std::string index = json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2) + "\n";
  atomic_file out(folder / index_file);
  out.write(index.data(), index.size());
  out.commit();
}

std::vector<named_tensor> load_weights(const std::filesystem::path& path) {
  if (std::filesystem::is_directory(path)) {
    if (std::filesystem::exists(path / index_file)) return load_index(path / index_file);
    if (std::filesystem::exists(path / single_file)) return load_safetensors(path / single_file).tensors;
    throw_error<std::invalid_argument>("'{}' holds neither {} nor {}", path.string(), single_file, index_file);
  }
  if (path.extension() == ".json") return load_index(path);
  return load_safetensors(path).tensors;
}

namespace {

// `cast_floating`: a floating tensor fills a floating one of another dtype, converted as it is copied.
weights_report copy_named(torch::nn::Module& module, const std::vector<named_tensor>& weights, bool strict,
                          bool (*skip)(std::string_view name), bool cast_floating, std::string_view who,
                          std::string_view fix) {
  std::map<std::string, const at::Tensor*> given;
  for (const named_tensor& t : weights) given.emplace(t.name, &t.tensor);
  weights_report report;
  std::vector<std::pair<at::Tensor, const at::Tensor*>> copies;
  for (const named_tensor& target : module_state(module)) {
    if (skip && skip(target.name)) continue;
    const auto found = given.find(target.name);
    if (found == given.end()) {
      report.missing.push_back(target.name);
      continue;
    }
    const tensor_spec want = target.spec();
    const tensor_spec have{target.name, found->second->sizes().vec(), found->second->scalar_type()};
    const bool converts = cast_floating && at::isFloatingType(want.dtype) && at::isFloatingType(have.dtype);
    if (want.shape != have.shape || (want.dtype != have.dtype && !converts)) {
      throw_error<std::invalid_argument>("{}: '{}' is {} in the weights but {} in the model", who, target.name,
                                         have.layout(), want.layout());
    }
    copies.emplace_back(target.tensor, found->second);
    given.erase(found);
  }
  for (const auto& [name, tensor] : given) report.unexpected.push_back(name);
  if (strict && (!report.missing.empty() || !report.unexpected.empty())) {
    throw_error<std::invalid_argument>("{}: the weights do not match the model: missing [{}], unexpected [{}] ({})",
                                       who, fmt::join(report.missing, ", "), fmt::join(report.unexpected, ", "), fix);
  }
  torch::NoGradGuard no_grad;
  for (auto& [destination, source] : copies) destination.copy_(*source);
  return report;
}

}  // namespace

weights_report copy_weights(torch::nn::Module& module, const std::vector<named_tensor>& weights, bool strict,
                            bool (*skip)(std::string_view name)) {
  return copy_named(module, weights, strict, skip, /*cast_floating=*/false, "load_weights",
                    "pass strict = false to load what matches");
}

std::size_t load_pretrained(torch::nn::Module& module, const std::filesystem::path& path) {
  const std::vector<named_tensor> weights = load_weights(path);
  const std::string who = fmt::format("pretrained(\"{}\")", path.string());
  (void)copy_named(module, weights, /*strict=*/true, nullptr, /*cast_floating=*/true, who,
                   "the checkpoint must hold every parameter and buffer of the model before lora, and nothing else");
  return weights.size();
}

}  // namespace loom

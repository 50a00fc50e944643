// A checkpoint folder's layout: the names of its step folders and rank files, the generators a rank's
// file holds, and the commit of a partial folder.
#include "layout.hpp"

#include "manifest_detail.hpp"

#include <loom/io/files.hpp>
#include <loom/runtime/failpoints.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <regex>

namespace loom::checkpoint_detail {
namespace {

namespace fs = std::filesystem;

}  // namespace

std::vector<std::pair<std::string, at::Generator>> generators(const runtime& rt) {
  std::vector<std::pair<std::string, at::Generator>> all{{"cpu", at::detail::getDefaultCPUGenerator()}};
  if (!rt.device().is_cpu()) all.emplace_back(rt.device().str(), at::globalContext().defaultGenerator(rt.device()));
  return all;
}

fs::path rank_file(int rank) { return fmt::format("rank-{:05}.safetensors", rank); }

std::optional<std::int64_t> step_of(const fs::path& folder, bool temporary) {
  static const std::regex complete(R"(step-(\d{8,}))");
  static const std::regex partial(R"(step-(\d{8,})\.tmp)");
  std::smatch match;
  const std::string name = folder.filename().string();
  if (!std::regex_match(name, match, temporary ? partial : complete)) return std::nullopt;
  return std::stoll(match[1].str());
}

std::vector<std::pair<std::int64_t, fs::path>> step_folders(const fs::path& folder) {
  std::vector<std::pair<std::int64_t, fs::path>> found;
  for (const auto& entry : fs::directory_iterator(folder)) {
    if (const auto step = step_of(entry.path(), /*temporary=*/false)) found.emplace_back(*step, entry.path());
  }
  std::sort(found.begin(), found.end());
  return found;
}

void commit_checkpoint(const fs::path& partial, const fs::path& final_path, const checkpoint_manifest& manifest,
                       int keep) {
  const std::string text = manifest_json(manifest).dump(2) + "\n";
  failpoint("checkpoint.before-manifest");
  atomic_file out(partial / manifest_file);
  out.write(text.data(), text.size());
  out.commit();
  failpoint("checkpoint.after-manifest");
  fs::remove_all(final_path);  // a checkpoint of the same step, from a run that is being redone
  fs::rename(partial, final_path);
  sync_directory(final_path.parent_path());
  failpoint("checkpoint.after-rename");
  const auto complete = step_folders(final_path.parent_path());
  for (std::size_t i = 0; i + static_cast<std::size_t>(keep) < complete.size(); ++i) fs::remove_all(complete[i].second);
}

}  // namespace loom::checkpoint_detail

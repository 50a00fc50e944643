// Resuming (docs/checkpoints.md): the newest complete checkpoint read, each file checked against the
// manifest's checksums, and loaded into the job and the optimizer; a damaged one set aside for the
// one before it, every rank agreeing which.
#include <loom/checkpoint/checkpoint.hpp>

#include "layout.hpp"
#include "manifest_detail.hpp"
#include "optimizer_bytes.hpp"
#include "reshard.hpp"

#include <loom/base/text.hpp>
#include <loom/io/files.hpp>
#include <loom/io/safetensors.hpp>
#include <loom/runtime/agreement.hpp>
#include <loom/runtime/failures.hpp>
#include <loom/schedule/schedule.hpp>

#include <ATen/core/Generator.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <set>
#include <span>
#include <sstream>

namespace loom {
namespace {

namespace fs = std::filesystem;
using checkpoint_detail::averages_prefix;
using checkpoint_detail::checkpoint_damage;
using checkpoint_detail::damaged;
using checkpoint_detail::generators;
using checkpoint_detail::hex;
using checkpoint_detail::load_optimizer;
using checkpoint_detail::load_resharded_optimizer;
using checkpoint_detail::model_prefix;
using checkpoint_detail::optimizer_key;
using checkpoint_detail::rank_file;
using checkpoint_detail::rank_state_key;
using checkpoint_detail::resharded_model;
using checkpoint_detail::rng_prefix;
using checkpoint_detail::saved_layout;
using checkpoint_detail::split_dims_key;
using checkpoint_detail::split_dims_of;

// The first line where two describe() texts differ, for the message.
std::string first_difference(const std::string& saved, const std::string& now) {
  std::istringstream a(saved), b(now);
  std::string left, right;
  while (true) {
    const bool more_a = static_cast<bool>(std::getline(a, left));
    const bool more_b = static_cast<bool>(std::getline(b, right));
    if (!more_a && !more_b) return "(none)";
    if (!more_a) left = "(nothing)";
    if (!more_b) right = "(nothing)";
    if (left != right) return fmt::format("saved '{}', now '{}'", left, right);
  }
}

// A checkpoint that this job cannot continue from, though nothing in it is damaged: the run in its
// folder is another one, which loom does not overwrite.
[[noreturn]] void unusable(const fs::path& checkpoint, const std::string& problem) {
  throw_error<checkpoint_error>(
      "the checkpoint '{}' cannot be resumed: {}. To start this run afresh, give it a folder of its own (loom::train's "
      "out; --train.out=DIR with a run file) or remove '{}'",
      checkpoint.string(), problem, checkpoint.parent_path().string());
}

// An error's text to go inside another message of loom's, without its own "loom: ".
std::string reason(const std::exception& error) {
  std::string text = error_text(error);
  if (std::string_view(text).starts_with(message_prefix)) text.erase(0, message_prefix.size());
  return text;
}

}  // namespace

// What one rank read of a checkpoint, checked, before anything is loaded into the job.
struct checkpointer::read_files {
  fs::path path;
  checkpoint_manifest manifest;
  bool resharding = false;
  saved_layout saved;                  // where one whole copy of its state lies
  std::string described;               // "its file 'rank-00001.safetensors'", for a message
  std::vector<tensor_state> models;    // one a file read: this rank's, or one whole copy's
  std::vector<tensor_state> averages;  // the moving average of the weights in each (empty: none)
  std::vector<at::Tensor> optimizers;  // the optimizer's archive of each
  std::vector<named_tensor> generators;
  std::string rank_state;           // this rank's, from its own file, when the world size is the saved one
  std::optional<std::string> note;  // for rank 0 to say once it is loaded (check_trained_over)
};

std::optional<resume_point> checkpointer::resume(const checkpoint_target& target, torch::optim::Optimizer& optimizer) {
  wait();
  const std::vector<fs::path> candidates = complete_checkpoints();
  std::optional<resume_point> resumed;
  for (std::size_t i = 0; i < candidates.size() && !resumed; ++i) {
    const fs::path& candidate = candidates[i];
    std::optional<read_files> files;
    std::optional<std::string> damage;
    run_on_every_rank(rt_, "reading the checkpoint", [&] {
      try {
        files = read(candidate, target);
      } catch (const checkpoint_damage& error) {
        damage = error.problem();
      }
    });
    const std::optional<rank_problem> found =
        first_problem(rt_, fmt::format("checkpoint/{}", candidate.filename().string()), damage);
    if (!found) {
      run_on_every_rank(rt_, "loading the checkpoint", [&] { resumed = load(*files, target, optimizer); });
      if (files->note && rt_.rank() == 0) {
        fmt::print(stderr, "{}\n", error_message("{}", *files->note));
        std::fflush(stderr);
      }
      break;
    }
    const std::string problem =
        fmt::format("the checkpoint '{}' is damaged: {}{}", candidate.string(), found->text,
                    rt_.is_distributed() ? fmt::format(" (found by rank {})", found->rank) : std::string());
    if (options_.strict || i + 1 == candidates.size()) {
      rt_.failures().mark_failed();
      throw_error<checkpoint_error>(
          "{}; {}, so the run stops before any step: restore the file, or move the checkpoint away to start over "
          "from the one before it or from the beginning",
          problem,
          options_.strict ? "checkpoint_options.strict refuses to fall back"
                          : "no earlier complete checkpoint is left to fall back to");
    }
    // Kept for a look at what went wrong, under a name no resume takes.
    const fs::path set_aside = fs::path(candidate.string() + ".damaged");
    run_on_rank_zero(rt_, "setting the damaged checkpoint aside", [&] {
      fs::remove_all(set_aside);
      fs::rename(candidate, set_aside);
      sync_directory(options_.folder);
      fmt::print(stderr, "{}; it is set aside as '{}', and the run falls back to '{}'\n", error_message("{}", problem),
                 set_aside.filename().string(), candidates[i + 1].string());
      std::fflush(stderr);
    });
  }
  // Every rank must continue from the same checkpoint (they read one folder, unless it changed
  // under them, or each rank sees a folder of its own).
  const std::string loaded = resumed ? fmt::format("step {} from {}", resumed->step, resumed->path.string())
                                     : std::string("nothing (no checkpoint)");
  const std::uint64_t hash = fnv1a(loaded);
  require_agreement(
      rt_, "checkpoint", std::span<const std::uint64_t>(&hash, 1), [&](std::size_t) { return loaded; },
      [&](const disagreement& d) {
        return error_message(
            "the ranks resumed from different checkpoints in '{}': rank 0 loaded {}, rank {} "
            "loaded {}; every rank must see the same folder",
            options_.folder.string(), d.rank0_item, d.rank, d.other_item);
      });
  return resumed;
}

checkpointer::read_files checkpointer::read(const fs::path& path, const checkpoint_target& target) const {
  read_files files;
  files.path = path;
  files.manifest = read_checkpoint_manifest(path);
  const checkpoint_manifest& manifest = files.manifest;
  if (manifest.plan != target.plan) {
    unusable(path, fmt::format("it was saved by another plan: {}", first_difference(manifest.plan, target.plan)));
  }
  const int saved_world = manifest.world_size;
  const int saved_group = manifest.shard_group_size;
  files.saved = saved_layout::of(manifest, target.strategy_shards);
  // Another layout of state each rank holds its own of (its shards, its slices), on either side.
  files.resharding = (target.sharded || manifest.sharded) &&
                     (saved_world != rt_.world_size() || saved_group != target.shard_group_size ||
                      manifest.tensor_parallel != target.tensor_parallel);
  const std::string fingerprint = hex(target.schedule_fingerprint);
  // A sharded schedule lists shard sizes and groups, which change with the layout.
  if (!files.resharding && manifest.schedule_fingerprint != fingerprint) {
    // A manifest written before the schedule was recorded has its fingerprint only.
    const std::string differs =
        manifest.schedule.empty() || manifest.schedule == target.schedule
            ? fmt::format("its step's collectives are not this job's (its schedule's fingerprint is {}, this job's {})",
                          manifest.schedule_fingerprint, fingerprint)
            : fmt::format("its step's collectives are not this job's: {}",
                          schedule_difference(manifest.schedule, target.schedule));
    unusable(path, differs +
                       "; the model's parameters (their names, shapes or dtypes, or which of them train) or "
                       "how the strategy groups them differ from the saved run's");
  }

  files.note = check_trained_over(path, manifest, target);

  // The files this rank reads: its own, or under a replicating strategy rank 0's, or when resharding
  // those of one whole copy (saved_layout; the other data-parallel ranks hold the same rows).
  const std::vector<int> sources =
      files.resharding ? files.saved.copy_ranks() : std::vector<int>{target.sharded ? rt_.rank() : 0};
  // Each file read once, checked against its checksum as it is read; the generators come from this
  // rank's own (below), which may be one of them.
  const auto checked = [&](int rank) {
    const std::string file = rank_file(rank).string();
    safetensors_content content;
    try {
      content = load_safetensors(path / file);
    } catch (const safetensors_error& error) {
      damaged(path, fmt::format("its file '{}' is not what its save wrote: {}", file, reason(error)));
    } catch (const file_error& error) {
      damaged(path, fmt::format("its file '{}' cannot be read: {}", file, reason(error)));
    }
    const file_digest& recorded = manifest.files.at(file);
    if (manifest.checksummed && content.digest != recorded) {
      damaged(path, fmt::format("its file '{}' does not match the checksum its manifest records (written {}, read {}): "
                                "it was damaged or replaced after the save",
                                file, hex(recorded.xxh3), hex(content.digest.xxh3)));
    }
    return content;
  };
  const int own_source = rt_.rank() % saved_world;
  const auto take_own = [&](safetensors_content& content) {
    for (named_tensor& t : content.tensors) {
      if (t.name.starts_with(rng_prefix)) files.generators.push_back(std::move(t));
    }
    const auto rank_state = content.metadata.find(rank_state_key);
    if (saved_world == rt_.world_size() && manifest.tensor_parallel == target.tensor_parallel &&
        rank_state != content.metadata.end()) {
      files.rank_state = rank_state->second;
    }
  };
  for (int rank : sources) {
    safetensors_content content = checked(rank);
    if (files.resharding && files.saved.tensor_parallel > 1 && rank == sources.front()) {
      const auto split = content.metadata.find(split_dims_key);
      if (split == content.metadata.end()) {
        damaged(path, fmt::format("its file '{}' does not record which tensors tensor_parallel({}) split",
                                  rank_file(rank).string(), files.saved.tensor_parallel));
      }
      try {
        files.saved.split_dims = split_dims_of(split->second);
      } catch (const checkpoint_error& error) {
        damaged(path, fmt::format("its file '{}': {}", rank_file(rank).string(), reason(error)));
      }
    }
    std::vector<named_tensor>& tensors = content.tensors;
    tensor_state& model = files.models.emplace_back();
    tensor_state& averages = files.averages.emplace_back();
    for (named_tensor& t : tensors) {
      if (t.name.starts_with(model_prefix)) model.push_back({t.name.substr(model_prefix.size()), std::move(t.tensor)});
      if (t.name.starts_with(averages_prefix)) {
        averages.push_back({t.name.substr(averages_prefix.size()), std::move(t.tensor)});
      }
      if (t.name == optimizer_key) files.optimizers.push_back(std::move(t.tensor));
    }
    if (files.optimizers.size() != files.models.size()) {
      unusable(path, fmt::format("its file '{}' holds no optimizer state", rank_file(rank).string()));
    }
    if (rank == own_source) take_own(content);
  }
  if (std::find(sources.begin(), sources.end(), own_source) == sources.end()) {
    safetensors_content content = checked(own_source);
    take_own(content);
  }
  files.described = files.resharding
                        ? fmt::format("the files of its {}", counted(static_cast<std::int64_t>(sources.size()), "rank"))
                        : fmt::format("its file '{}'", rank_file(sources.front()).string());
  return files;
}

resume_point checkpointer::load(const read_files& files, const checkpoint_target& target,
                                torch::optim::Optimizer& optimizer) const {
  const auto bad = [&](const std::string& problem) { unusable(files.path, problem); };
  const bool resharding = files.resharding;
  try {
    target.load(
        with_current(target, resharding ? resharded_model(target, files.saved, files.models) : files.models.front()));
  } catch (const std::exception& error) {
    bad(fmt::format("{} do{} not fit this model: {}", files.described, resharding ? "" : "es", reason(error)));
  }
  if (target.load_averages) {
    if (files.averages.front().empty()) {
      bad("it holds no moving average of the weights (it was saved by a run without ema); resume it without ema, "
          "or start the averaged run afresh");
    }
    try {
      target.load_averages(resharding ? resharded_model(target, files.saved, files.averages) : files.averages.front());
    } catch (const std::exception& error) {
      bad(fmt::format("the moving average of the weights in {} does not fit this model: {}", files.described,
                      reason(error)));
    }
  }
  try {
    if (resharding) {
      load_resharded_optimizer(target, files.saved, optimizer, files.models, files.optimizers);
    } else {
      load_optimizer(optimizer, files.optimizers.front());
    }
  } catch (const std::exception& error) {
    bad(fmt::format("{} hold{} an optimizer state that does not fit this optimizer: {}", files.described,
                    resharding ? "" : "s", reason(error)));
  }

  // The generators: this rank's own; over another number of ranks, those of the old rank of its
  // number modulo theirs (dropout then draws other numbers than a run that was never resharded).
  for (auto& [device, generator] : generators(rt_)) {
    const std::string key = std::string(rng_prefix) + device;  // clang before 16 captures no structured binding
    const auto saved = std::find_if(files.generators.begin(), files.generators.end(),
                                    [&](const named_tensor& t) { return t.name == key; });
    if (saved == files.generators.end()) bad(fmt::format("it holds no state of the {} generator", device));
    const std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(saved->tensor);
  }
  return {.step = files.manifest.step,
          .user_state = files.manifest.user_state,
          .path = files.path,
          .rank_state = files.rank_state,
          .world_size = files.manifest.world_size,
          .tensor_parallel = files.manifest.tensor_parallel};
}

trained_over checkpointer::trained(const checkpoint_target& target) const {
  trained_over over{.data = options_.data};
  if (target.pretrained) {
    over.pretrained = target.pretrained->path.string();
    over.pretrained_digest = hex(target.pretrained->digest);
  }
  return over;
}

std::optional<std::string> checkpointer::check_trained_over(const fs::path& path, const checkpoint_manifest& manifest,
                                                            const checkpoint_target& target) const {
  if (!manifest.trained) {
    return fmt::format(
        "the checkpoint '{}' records nothing of the pretrained weights and the data it was trained over (loom {} "
        "saved it, before checkpoints recorded them), so it resumes without that check",
        path.string(), manifest.loom);
  }
  const trained_over& saved = *manifest.trained;
  const trained_over now = trained(target);
  // Compared where both runs had them: the plan already names pretrained(...)'s presence and path.
  const bool other_weights = !saved.pretrained_digest.empty() && !now.pretrained_digest.empty() &&
                             saved.pretrained_digest != now.pretrained_digest;
  const bool other_data = !saved.data.empty() && !now.data.empty() && saved.data != now.data;
  if (!other_weights && !other_data) return std::nullopt;
  std::vector<std::string> both;
  if (other_weights) {
    both.push_back(
        fmt::format("it was trained over the pretrained weights '{}' (digest {}), and this run's '{}' are "
                    "others (digest {})",
                    saved.pretrained, saved.pretrained_digest, now.pretrained, now.pretrained_digest));
  }
  if (other_data) {
    both.push_back(fmt::format("it was trained over the data {}, and this run reads {}", saved.data, now.data));
  }
  const std::string what =
      fmt::format("the checkpoint '{}' was trained over other {} than this run's: {}", path.string(),
                  other_weights && other_data ? "pretrained weights and other data"
                  : other_weights             ? "pretrained weights"
                                              : "data",
                  fmt::join(both, "; "));
  if (options_.resume_over_changes) {
    return what + "; resume_over_changes is set, so it resumes over this run's nonetheless";
  }
  throw_error<checkpoint_error>(
      "{}; to start this run afresh, give it a folder of its own (loom::train's out; --train.out=DIR with a run "
      "file) or remove '{}', or to resume over this run's anyway set loom::train's resume_over_changes "
      "(--train.resume_over_changes=true with a run file; checkpoint_options.resume_over_changes for a checkpointer "
      "of your own)",
      what, path.parent_path().string());
}

tensor_state checkpointer::with_current(const checkpoint_target& target, const tensor_state& saved) {
  std::map<std::string, const at::Tensor*> by_name;
  for (const named_tensor& t : saved) by_name.emplace(t.name, &t.tensor);
  tensor_state state = target.state();
  const std::set<std::string> frozen(target.frozen_names.begin(), target.frozen_names.end());
  for (named_tensor& t : state) {
    const auto found = by_name.find(t.name);
    if (found != by_name.end()) {
      t.tensor = *found->second;
      by_name.erase(found);
    } else if (!frozen.contains(t.name)) {
      throw_error<checkpoint_error>("'{}' trains or is a buffer here, but the checkpoint does not hold it", t.name);
    }
  }
  if (!by_name.empty()) {
    throw_error<checkpoint_error>("the checkpoint holds '{}', which this model lacks", by_name.begin()->first);
  }
  return state;
}

}  // namespace loom

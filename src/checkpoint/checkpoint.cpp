// The checkpointer (docs/checkpoints.md): its construction, which removes an interrupted save's
// leftovers; the save, synchronous or written by background threads that poll() and wait() complete;
// and the complete checkpoints of its folder.
#include <loom/checkpoint/checkpoint.hpp>

#include "layout.hpp"
#include "manifest_detail.hpp"
#include "optimizer_bytes.hpp"
#include "reshard.hpp"

#include <loom/base/text.hpp>
#include <loom/io/files.hpp>
#include <loom/io/safetensors.hpp>
#include <loom/runtime/failpoints.hpp>
#include <loom/runtime/failures.hpp>
#include <loom/runtime/host_reads.hpp>

#include <ATen/ATen.h>
#include <ATen/core/Generator.h>
#include <fmt/format.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <torch/version.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <variant>

namespace loom {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using checkpoint_detail::archive_bytes;
using checkpoint_detail::averages_prefix;
using checkpoint_detail::commit_checkpoint;
using checkpoint_detail::frozen_archive;
using checkpoint_detail::generators;
using checkpoint_detail::hex;
using checkpoint_detail::manifest_file;
using checkpoint_detail::model_prefix;
using checkpoint_detail::optimizer_bytes;
using checkpoint_detail::optimizer_key;
using checkpoint_detail::rank_file;
using checkpoint_detail::rank_state_key;
using checkpoint_detail::rng_prefix;
using checkpoint_detail::split_dims_key;
using checkpoint_detail::split_dims_text;
using checkpoint_detail::step_folders;
using checkpoint_detail::step_of;

// The caller's state, which must be JSON.
void require_json(const std::string& user_state) {
  try {
    [[maybe_unused]] const json parsed = json::parse(user_state);
  } catch (const json::exception& error) {
    throw_error<std::invalid_argument>("checkpoint user_state is not JSON ({})", error.what());
  }
}

// What this rank writes: its share of the model (the trainable parameters and buffers, or all of
// them) and the optimizer's state when it holds a share of the model, and its generators always.
// For a synchronous save, the parameters themselves and the optimizer's archive serialised now. For
// an asynchronous one, copies that the next steps leave alone: the model's tensors, and the
// optimizer's archive of copies of its state, serialised by the writing thread (or now, for an
// optimizer whose state copied_state() does not know).
struct rank_file_contents {
  std::vector<named_tensor> model;  // and the averages, after it
  std::variant<std::monostate, at::Tensor, torch::serialize::OutputArchive> optimizer;
  std::vector<named_tensor> generators;

  // In the file's order.
  [[nodiscard]] std::vector<named_tensor> tensors() {
    std::vector<named_tensor> all = model;
    if (auto* archive = std::get_if<torch::serialize::OutputArchive>(&optimizer)) {
      all.push_back({optimizer_key, archive_bytes(*archive)});
    } else if (const auto* bytes = std::get_if<at::Tensor>(&optimizer)) {
      all.push_back({optimizer_key, *bytes});
    }
    all.insert(all.end(), generators.begin(), generators.end());
    return all;
  }
};

// `copied`: the model's tensors and the optimizer's state staged into host buffers that the next
// steps leave alone (an asynchronous save); else the model's host tensors as they are, a device's
// staged all the same, so that every read of the device goes through `staging`.
rank_file_contents rank_file_of(const runtime& rt, const checkpoint_target& target, torch::optim::Optimizer& optimizer,
                                bool all_parameters, bool copied, host_staging& staging) {
  rank_file_contents contents;
  staging.begin();
  if (target.sharded || rt.rank() == 0) {
    const std::set<std::string> frozen(target.frozen_names.begin(), target.frozen_names.end());
    for (const named_tensor& t : target.state()) {
      if (all_parameters || !frozen.contains(t.name)) {
        const bool stage = copied || !t.tensor.is_cpu();
        contents.model.push_back({std::string(model_prefix) + t.name, stage ? staging.stage(t.tensor) : t.tensor});
      }
    }
    if (target.averages) {
      // Updated in place by the next steps: staged always.
      for (const named_tensor& t : target.averages()) {
        contents.model.push_back({std::string(averages_prefix) + t.name, staging.stage(t.tensor)});
      }
    }
    if (auto archive = copied ? frozen_archive(optimizer, staging) : std::nullopt) {
      contents.optimizer = std::move(*archive);
    } else {
      contents.optimizer = optimizer_bytes(optimizer);
    }
  }
  staging.finish(rt.progress());
  for (auto& [device, generator] : generators(rt)) {
    const std::lock_guard<std::mutex> lock(generator.mutex());
    contents.generators.push_back({std::string(rng_prefix) + device, generator.get_state()});
  }
  return contents;
}

// Every rank's digest of its file, in the manifest's files: each rank's in its row of a sum.
void with_every_digest(const runtime& rt, checkpoint_manifest& manifest, const file_digest& mine) {
  at::Tensor digests = at::zeros({rt.world_size(), 2}, at::kLong);
  digests[rt.rank()][0] = static_cast<std::int64_t>(mine.bytes);
  digests[rt.rank()][1] = static_cast<std::int64_t>(mine.xxh3);
  rt.host_comm().all_reduce(digests).wait();
  for (int rank = 0; rank < rt.world_size(); ++rank) {
    manifest.files[rank_file(rank).string()] = {static_cast<std::uint64_t>(host_value<std::int64_t>(digests[rank][0])),
                                                static_cast<std::uint64_t>(host_value<std::int64_t>(digests[rank][1]))};
  }
}

// What `work` threw, or nullptr: a background part's outcome, rethrown where every rank agrees on it.
std::exception_ptr outcome_of(const std::function<void()>& work) {
  try {
    work();
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

// Whether every rank's part of a background `what` has ended (`mine`, when this rank's has: its
// outcome), after one small all-reduce; when one rank's part failed, every rank throws as
// run_on_every_rank has them do.
bool every_rank_done(const runtime& rt, std::string_view what, const std::optional<std::exception_ptr>& mine) {
  const bool failed = mine && *mine;
  // On the host: a save in flight costs each step one small exchange, never a read of the device.
  at::Tensor state = at::tensor({mine ? 0 : 1, failed ? 1 : 0}, at::TensorOptions().dtype(at::kInt));
  rt.host_comm().all_reduce(state).wait();
  if (host_value<int>(state[1]) > 0) {
    run_on_every_rank(rt, what, [&] {
      if (failed) std::rethrow_exception(*mine);
    });
  }
  return host_value<int>(state[0]) == 0;
}

}  // namespace

checkpointer::checkpointer(const runtime& rt, checkpoint_options options) : rt_(rt), options_(std::move(options)) {
  if (options_.keep < 1) {
    throw_error<std::invalid_argument>("checkpoint_options.keep is {}; keep at least 1", options_.keep);
  }
  run_on_rank_zero(rt_, "preparing the checkpoint folder", [&] {
    std::error_code error;
    fs::create_directories(options_.folder, error);
    if (error || !fs::is_directory(options_.folder)) {
      throw_error<file_error>("the checkpoint folder '{}' cannot be created: {}", options_.folder.string(),
                              error ? error.message() : "it is not a folder");
    }
    for (const auto& entry : fs::directory_iterator(options_.folder)) {
      if (step_of(entry.path(), /*temporary=*/true)) fs::remove_all(entry.path());  // an interrupted save
    }
  });
}

// An asynchronous save: where it goes, the manifest that completes it, and its two parts, each on a
// background thread: every rank writes its file, then rank 0 writes the manifest, renames the folder
// and removes the oldest checkpoints. Each part's end is agreed at a poll(), and the second starts
// at the poll that sees every file written.
struct checkpointer::save_in_flight {
  fs::path partial;
  fs::path final_path;
  checkpoint_manifest manifest;
  file_digest digest;                         // of this rank's file, once written
  std::future<std::exception_ptr> writing;    // this rank's file
  std::future<std::exception_ptr> finishing;  // rank 0's part, once every file is written
  bool finishing_started = false;
  std::optional<std::exception_ptr> outcome;  // of the part under way on this rank, once it has ended

  std::future<std::exception_ptr>& running() { return finishing_started ? finishing : writing; }
};

checkpointer::~checkpointer() {
  if (!in_flight_) return;
  for (auto* part : {&in_flight_->writing, &in_flight_->finishing}) {
    if (part->valid()) part->wait();
  }
}

std::vector<fs::path> checkpointer::complete_checkpoints() const {
  if (!fs::is_directory(options_.folder)) return {};
  const auto folders = step_folders(options_.folder);
  std::vector<fs::path> newest_first;
  for (auto folder = folders.rbegin(); folder != folders.rend(); ++folder) {
    if (fs::exists(folder->second / manifest_file)) newest_first.push_back(folder->second);
  }
  return newest_first;
}

std::optional<fs::path> checkpointer::latest() const {
  std::vector<fs::path> complete = complete_checkpoints();
  if (complete.empty()) return std::nullopt;
  return std::move(complete.front());
}

void checkpointer::save(const checkpoint_target& target, torch::optim::Optimizer& optimizer, std::int64_t step,
                        const std::string& user_state, const std::string& rank_state) {
  require_json(user_state);
  wait();
  const fs::path final_path = options_.folder / fmt::format("step-{:08}", step);
  const fs::path partial = fs::path(final_path.string() + ".tmp");
  run_on_rank_zero(rt_, "starting the checkpoint", [&] {
    fs::remove_all(partial);
    fs::create_directories(partial);
    sync_directory(options_.folder);
  });
  rank_file_contents contents =
      rank_file_of(rt_, target, optimizer, options_.all_parameters, options_.async_save, staging_);
  checkpoint_manifest manifest{.step = step,
                               .world_size = rt_.world_size(),
                               .shard_group_size = target.sharded ? target.shard_group_size : rt_.world_size(),
                               .sharded = target.sharded,
                               .tensor_parallel = target.tensor_parallel,
                               .all_parameters = options_.all_parameters,
                               .plan = target.plan,
                               .describe = target.describe,
                               .schedule_fingerprint = hex(target.schedule_fingerprint),
                               .schedule = target.schedule,
                               .libtorch = TORCH_VERSION,
                               .loom = LOOM_VERSION,
                               .user_state = user_state,
                               .trained = trained(target),
                               .files = {},
                               .checksummed = true};
  const fs::path file = partial / rank_file(rt_.rank());
  std::map<std::string, std::string> metadata{{"step", std::to_string(step)}};
  if (!rank_state.empty()) metadata.emplace(rank_state_key, rank_state);
  if (target.tensor_parallel > 1) metadata.emplace(split_dims_key, split_dims_text(target.whole_layouts()));
  const auto write = [file, metadata = std::move(metadata)](rank_file_contents& written) {
    failpoint("checkpoint.before-shard");
    const file_digest digest = save_safetensors(file, written.tensors(), metadata);
    failpoint("checkpoint.after-shard");
    return digest;
  };
  if (options_.async_save) {
    in_flight_ = std::make_unique<save_in_flight>();
    in_flight_->partial = partial;
    in_flight_->final_path = final_path;
    in_flight_->manifest = std::move(manifest);
    in_flight_->writing =
        std::async(std::launch::async, [write, written = std::move(contents), &digest = in_flight_->digest]() mutable {
          return outcome_of([&] { digest = write(written); });
        });
    return;
  }
  file_digest digest;
  run_on_every_rank(rt_, "writing the checkpoint", [&] { digest = write(contents); });
  complete(partial, final_path, std::move(manifest), digest);
}

void checkpointer::poll() {
  if (!in_flight_) return;
  save_in_flight& save = *in_flight_;
  std::future<std::exception_ptr>& running = save.running();
  if (!save.outcome && (!running.valid() || running.wait_for(std::chrono::seconds(0)) == std::future_status::ready)) {
    save.outcome = running.valid() ? running.get() : nullptr;  // a rank with no part in it is done
  }
  const bool finishing = save.finishing_started;
  if (!every_rank_done(
          rt_, finishing ? "finishing the checkpoint in the background" : "writing the checkpoint in the background",
          save.outcome)) {
    return;
  }
  if (finishing) {
    in_flight_.reset();
    return;
  }
  with_every_digest(rt_, save.manifest, save.digest);
  save.outcome.reset();
  save.finishing_started = true;
  if (rt_.rank() == 0) {
    save.finishing = std::async(std::launch::async, [&save, keep = options_.keep] {
      return outcome_of([&] { commit_checkpoint(save.partial, save.final_path, save.manifest, keep); });
    });
  }
}

void checkpointer::wait() {
  while (in_flight_) {
    std::future<std::exception_ptr>& running = in_flight_->running();
    if (!in_flight_->outcome && running.valid()) in_flight_->outcome = running.get();
    poll();
  }
}

void checkpointer::complete(const fs::path& partial, const fs::path& final_path, checkpoint_manifest manifest,
                            const file_digest& mine) {
  with_every_digest(rt_, manifest, mine);
  run_on_rank_zero(rt_, "finishing the checkpoint",
                   [&] { commit_checkpoint(partial, final_path, manifest, options_.keep); });
}

}  // namespace loom

#include <loom/checkpoint/checkpoint.hpp>

#include <loom/io/files.hpp>
#include <loom/io/optimizer_state.hpp>
#include <loom/io/safetensors.hpp>
#include <loom/runtime/agreement.hpp>
#include <loom/runtime/failpoints.hpp>
#include <loom/runtime/failures.hpp>
#include <loom/runtime/text.hpp>
#include <loom/schedule/schedule.hpp>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <torch/version.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <mutex>
#include <regex>
#include <set>
#include <sstream>
#include <type_traits>
#include <variant>

namespace loom {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// v2 records every file's checksum and the manifest's own; v1, sizes only, is still read.
constexpr const char* format_name = "loom checkpoint v2";
constexpr const char* unchecksummed_format_name = "loom checkpoint v1";
constexpr const char* manifest_file = "manifest.json";
constexpr const char* manifest_checksum_key = "manifest_xxh3";
constexpr std::string_view model_prefix = "model/";
constexpr const char* optimizer_key = "optimizer";
constexpr std::string_view rng_prefix = "rng/";

// The default generators this rank draws from: the CPU's, and its device's when that is a GPU.
std::vector<std::pair<std::string, at::Generator>> generators(const runtime& rt) {
  std::vector<std::pair<std::string, at::Generator>> all{{"cpu", at::detail::getDefaultCPUGenerator()}};
  if (!rt.device().is_cpu()) all.emplace_back(rt.device().str(), at::globalContext().defaultGenerator(rt.device()));
  return all;
}

fs::path rank_file(int rank) { return fmt::format("rank-{:05}.safetensors", rank); }

// step-00000012 (complete) or step-00000012.tmp (a save in progress, or interrupted)
std::optional<std::int64_t> step_of(const fs::path& folder, bool temporary) {
  static const std::regex complete(R"(step-(\d{8,}))");
  static const std::regex partial(R"(step-(\d{8,})\.tmp)");
  std::smatch match;
  const std::string name = folder.filename().string();
  if (!std::regex_match(name, match, temporary ? partial : complete)) return std::nullopt;
  return std::stoll(match[1].str());
}

// The archive's bytes as a tensor that owns them, with no copy of its own.
at::Tensor archive_bytes(torch::serialize::OutputArchive& archive) {
  auto bytes = std::make_shared<std::string>();
  archive.save_to([&bytes](const void* data, std::size_t size) {
    bytes->append(static_cast<const char*>(data), size);
    return size;
  });
  void* data = bytes->data();
  const auto size = static_cast<std::int64_t>(bytes->size());
  return at::from_blob(
      data, {size}, [owner = std::move(bytes)](void*) {}, at::TensorOptions().dtype(at::kByte));
}

at::Tensor optimizer_bytes(torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  return archive_bytes(archive);
}

// The optimizer's archive of its state as it is now, in tensors its next steps leave alone: its
// states swapped for copies while it saves, then given back. Nothing when a state is of a kind
// copied_state() does not know, whose archive would hold the live tensors.
std::optional<torch::serialize::OutputArchive> frozen_archive(torch::optim::Optimizer& optimizer,
                                                              host_staging& staging) {
  auto& states = optimizer.state();
  std::vector<std::pair<void*, std::unique_ptr<torch::optim::OptimizerParamState>>> swapped;
  for (const auto& [key, state] : states) {
    auto copy = copied_state(*state, [&staging](const at::Tensor& t) { return staging.stage(t); });
    if (!copy) return std::nullopt;
    swapped.emplace_back(key, std::move(copy));
  }
  const auto swap_all = [&] {
    for (auto& [key, state] : swapped) std::swap(states[key], state);
  };
  swap_all();
  torch::serialize::OutputArchive archive;
  try {
    optimizer.save(archive);
  } catch (...) {
    swap_all();
    throw;
  }
  swap_all();
  return archive;
}

void load_optimizer(torch::optim::Optimizer& optimizer, const at::Tensor& bytes) {
  torch::serialize::InputArchive archive;
  archive.load_from(static_cast<const char*>(bytes.const_data_ptr()), static_cast<std::size_t>(bytes.numel()));
  optimizer.load(archive);
}

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

// A manifest's value, for a message: a number or a short string as written, anything else by its
// kind ("an object").
std::string described(const json& value) {
  if (value.is_number() || (value.is_string() && value.get_ref<const std::string&>().size() <= 40)) {
    return value.dump();
  }
  const std::string_view kind = value.type_name();
  return fmt::format("{} {}", kind.find_first_of("aeiou") == 0 ? "an" : "a", kind);
}

// A checkpoint that this job cannot continue from, though nothing in it is damaged: the run in its
// folder is another one, which loom does not overwrite.
[[noreturn]] void unusable(const fs::path& checkpoint, const std::string& problem) {
  throw_error<checkpoint_error>(
      "the checkpoint '{}' cannot be resumed: {}. To start this run afresh, give it a folder of its own (loom::train's "
      "out; --train.out=DIR with a run file) or remove '{}'",
      checkpoint.string(), problem, checkpoint.parent_path().string());
}

// A checkpoint whose bytes are not those its save wrote: a manifest or a file damaged, missing,
// truncated or replaced. Unlike a checkpoint of another plan, an earlier one may still be good.
class checkpoint_damage : public checkpoint_error {
 public:
  checkpoint_damage(const fs::path& checkpoint, std::string problem)
      : checkpoint_error(error_message("the checkpoint '{}' cannot be resumed: {}", checkpoint.string(), problem)),
        problem_(std::move(problem)) {}
  [[nodiscard]] const std::string& problem() const noexcept { return problem_; }

 private:
  std::string problem_;
};

[[noreturn]] void damaged(const fs::path& checkpoint, std::string problem) {
  throw checkpoint_damage(checkpoint, std::move(problem));
}

std::string hex(std::uint64_t value) { return fmt::format("{:016x}", value); }

// A checksum as the manifest writes it: 16 hexadecimal digits.
std::optional<std::uint64_t> from_hex(const json& value) {
  if (!value.is_string()) return std::nullopt;
  const std::string& text = value.get_ref<const std::string&>();
  std::uint64_t parsed = 0;
  const char* end = text.data() + text.size();
  if (text.size() != 16 || std::from_chars(text.data(), end, parsed, 16).ptr != end) return std::nullopt;
  return parsed;
}

// The manifest's own checksum: XXH3-64 of the manifest without that field, as dump(2) writes it.
std::uint64_t manifest_checksum(const json& manifest_without_it) {
  const std::string text = manifest_without_it.dump(2);
  return xxh3_of(text.data(), text.size());
}

// The kinds of value a manifest's field holds, for the writer and the reader.
struct count_field {  // a whole number in [min, max], which JSON reads as unsigned
  std::uint64_t min;
  std::uint64_t max;
  const char* kind;
  bool optional = false;  // a manifest written before the field existed may lack it: then 0
};
struct flag_field {};
struct choice_field {  // true is `yes`, false is `no`
  const char* yes;
  const char* no;
};
struct text_field {
  bool optional = false;  // absent from manifests written before it
};
struct json_field {};  // JSON of the caller's, kept as its text

// The manifest's fields, each once: its key, its member of checkpoint_manifest and its kind. The
// writer and the reader both walk this list ("format" and "files" are the file's own, not the
// struct's).
template <class Manifest, class Visit>
void for_each_manifest_field(Manifest& manifest, Visit&& visit) {
  visit("step", manifest.step,
        count_field{0, static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()), "a step number"});
  visit("world_size", manifest.world_size,
        count_field{1, static_cast<std::uint64_t>(std::numeric_limits<int>::max()), "a number of ranks"});
  visit("shard_group_size", manifest.shard_group_size,
        count_field{1, static_cast<std::uint64_t>(std::numeric_limits<int>::max()), "a number of ranks", true});
  visit("sharded", manifest.sharded, flag_field{});
  visit("parameters", manifest.all_parameters, choice_field{"all", "trainable"});
  visit("plan", manifest.plan, text_field{});
  visit("describe", manifest.describe, text_field{});
  visit("schedule_fingerprint", manifest.schedule_fingerprint, text_field{});
  visit("schedule", manifest.schedule, text_field{.optional = true});
  visit("libtorch", manifest.libtorch, text_field{});
  visit("loom", manifest.loom, text_field{});
  visit("user_state", manifest.user_state, json_field{});
}

json manifest_json(const checkpoint_manifest& manifest) {
  json out = {{"format", format_name}};
  for_each_manifest_field(manifest, [&](const char* key, const auto& value, const auto& kind) {
    using kind_type = std::remove_cvref_t<decltype(kind)>;
    if constexpr (std::is_same_v<kind_type, choice_field>) {
      out[key] = value ? kind.yes : kind.no;
    } else if constexpr (std::is_same_v<kind_type, json_field>) {
      out[key] = json::parse(value);
    } else {
      out[key] = value;
    }
  });
  json files = json::object();
  for (const auto& [name, digest] : manifest.files) files[name] = {{"bytes", digest.bytes}, {"xxh3", hex(digest.xxh3)}};
  out["files"] = std::move(files);
  out[manifest_checksum_key] = hex(manifest_checksum(out));
  return out;
}

// The fields of a manifest's JSON, each checked against its kind.
checkpoint_manifest manifest_fields(const fs::path& path, const json& manifest) {
  const auto at = [&](const char* key) -> const json& {
    const auto found = manifest.find(key);
    if (found == manifest.end()) damaged(path, fmt::format("its manifest has no {}", key));
    return *found;
  };
  const auto wrong = [&](const char* key, const std::string& kind) {
    damaged(path, fmt::format("its manifest's {} is {}, not {}", key, described(at(key)), kind));
  };
  checkpoint_manifest read;
  for_each_manifest_field(read, [&](const char* key, auto& value, const auto& kind) {
    using kind_type = std::remove_cvref_t<decltype(kind)>;
    if constexpr (std::is_same_v<kind_type, count_field> || std::is_same_v<kind_type, text_field>) {
      if (kind.optional && !manifest.contains(key)) return;
    }
    const json& field = at(key);
    if constexpr (std::is_same_v<kind_type, count_field>) {
      if (!field.is_number_unsigned() || field.get<std::uint64_t>() < kind.min ||
          field.get<std::uint64_t>() > kind.max) {
        wrong(key, kind.kind);
      }
      value = static_cast<std::remove_cvref_t<decltype(value)>>(field.get<std::uint64_t>());
    } else if constexpr (std::is_same_v<kind_type, flag_field>) {
      if (!field.is_boolean()) wrong(key, "true or false");
      value = field.get<bool>();
    } else if constexpr (std::is_same_v<kind_type, choice_field>) {
      if (field != kind.yes && field != kind.no) wrong(key, fmt::format(R"("{}" or "{}")", kind.yes, kind.no));
      value = field == kind.yes;
    } else if constexpr (std::is_same_v<kind_type, text_field>) {
      if (!field.is_string()) wrong(key, "a string");
      value = field.get<std::string>();
    } else {
      value = field.dump();
    }
  });
  return read;
}

// One file a rank, each there and of the size the manifest's "files" records: in v2 an object of
// its bytes and checksum, in v1 its bytes alone.
std::map<std::string, file_digest> rank_files(const fs::path& path, const json& manifest, int world_size,
                                              bool checksummed) {
  const auto listed = manifest.find("files");
  if (listed == manifest.end()) damaged(path, "its manifest has no files");
  const json& files = *listed;
  if (!files.is_object()) damaged(path, fmt::format("its manifest's files is {}, not an object", described(files)));
  if (files.size() != static_cast<std::size_t>(world_size)) {
    damaged(path, fmt::format("its manifest lists {} for its world_size of {}",
                              counted(static_cast<std::int64_t>(files.size()), "file"), world_size));
  }
  std::map<std::string, file_digest> digests;
  for (int rank = 0; rank < world_size; ++rank) {
    const std::string file = rank_file(rank).string();
    const auto entry = files.find(file);
    if (entry == files.end()) damaged(path, fmt::format("its manifest lists no file '{}' for rank {}", file, rank));
    const json* size = &*entry;
    file_digest& digest = digests[file];
    if (checksummed) {
      const auto bytes = entry->is_object() ? entry->find("bytes") : entry->end();
      const auto xxh3 = entry->is_object() && entry->contains("xxh3") ? from_hex(entry->at("xxh3")) : std::nullopt;
      if (bytes == entry->end() || !xxh3) {
        damaged(path, fmt::format(R"(its manifest gives '{}' as {}, not {{"bytes": …, "xxh3": "<16 hex digits>"}})",
                                  file, described(*entry)));
      }
      digest.xxh3 = *xxh3;
      size = &*bytes;
    }
    if (!size->is_number_unsigned()) {
      damaged(path,
              fmt::format("its manifest gives the size of '{}' as {}, not a number of bytes", file, described(*size)));
    }
    digest.bytes = size->get<std::uint64_t>();
    std::error_code error;
    const auto actual = fs::file_size(path / file, error);
    if (error) damaged(path, fmt::format("its file '{}' is missing", file));
    if (actual != digest.bytes) {
      damaged(path, fmt::format("its file '{}' is {} bytes, the manifest says {}: truncated or overwritten", file,
                                actual, digest.bytes));
    }
  }
  return digests;
}

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
  std::vector<named_tensor> model;
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

// The folders of `folder` named as complete checkpoints (step-N), oldest first.
std::vector<std::pair<std::int64_t, fs::path>> step_folders(const fs::path& folder) {
  std::vector<std::pair<std::int64_t, fs::path>> found;
  for (const auto& entry : fs::directory_iterator(folder)) {
    if (const auto step = step_of(entry.path(), /*temporary=*/false)) found.emplace_back(*step, entry.path());
  }
  std::sort(found.begin(), found.end());
  return found;
}

// The manifest, written last into `partial`, which then becomes `final_path`: the checkpoint is
// complete once the rename is on disk. Then all but the newest `keep` checkpoints beside it go.
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

// Every rank's digest of its file, in the manifest's files: each rank's in its row of a sum.
void with_every_digest(const runtime& rt, checkpoint_manifest& manifest, const file_digest& mine) {
  at::Tensor digests = at::zeros({rt.world_size(), 2}, at::kLong);
  digests[rt.rank()][0] = static_cast<std::int64_t>(mine.bytes);
  digests[rt.rank()][1] = static_cast<std::int64_t>(mine.xxh3);
  rt.host_comm().all_reduce(digests).wait();
  for (int rank = 0; rank < rt.world_size(); ++rank) {
    manifest.files[rank_file(rank).string()] = {static_cast<std::uint64_t>(digests[rank][0].item<std::int64_t>()),
                                                static_cast<std::uint64_t>(digests[rank][1].item<std::int64_t>())};
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
  if (state[1].item<int>() > 0) {
    run_on_every_rank(rt, what, [&] {
      if (failed) std::rethrow_exception(*mine);
    });
  }
  return state[0].item<int>() == 0;
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
                        const std::string& user_state) {
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
                               .all_parameters = options_.all_parameters,
                               .plan = target.plan,
                               .describe = target.describe,
                               .schedule_fingerprint = hex(target.schedule_fingerprint),
                               .schedule = target.schedule,
                               .libtorch = TORCH_VERSION,
                               .loom = LOOM_VERSION,
                               .user_state = user_state,
                               .files = {},
                               .checksummed = true};
  const fs::path file = partial / rank_file(rt_.rank());
  const auto write = [file, step](rank_file_contents& written) {
    failpoint("checkpoint.before-shard");
    const file_digest digest = save_safetensors(file, written.tensors(), {{"step", std::to_string(step)}});
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

checkpoint_manifest read_checkpoint_manifest(const fs::path& path) {
  json manifest;
  try {
    std::ifstream in(path / manifest_file);
    manifest = json::parse(in);
  } catch (const json::exception& error) {
    damaged(path, fmt::format("its {} is not JSON ({})", manifest_file, error.what()));
  }
  if (!manifest.is_object()) damaged(path, fmt::format("its {} is not a JSON object", manifest_file));
  const auto format = manifest.find("format");
  const bool checksummed = format != manifest.end() && *format == format_name;
  if (!checksummed && (format == manifest.end() || *format != unchecksummed_format_name)) {
    damaged(path, "its manifest is not a loom checkpoint's");
  }
  if (checksummed) {
    const auto recorded =
        manifest.contains(manifest_checksum_key) ? from_hex(manifest[manifest_checksum_key]) : std::nullopt;
    if (!recorded) damaged(path, fmt::format("its manifest has no {} of 16 hex digits", manifest_checksum_key));
    manifest.erase(manifest_checksum_key);
    if (const std::uint64_t actual = manifest_checksum(manifest); actual != *recorded) {
      damaged(path, fmt::format("its {} does not match its own checksum (written {}, read {}): it was damaged or "
                                "edited after the save",
                                manifest_file, hex(*recorded), hex(actual)));
    }
  }
  checkpoint_manifest read = manifest_fields(path, manifest);
  if (read.shard_group_size == 0) read.shard_group_size = read.world_size;
  if (read.world_size % read.shard_group_size != 0) {
    damaged(path, fmt::format("its manifest's shard_group_size {} does not divide its world_size {}",
                              read.shard_group_size, read.world_size));
  }
  read.checksummed = checksummed;
  read.files = rank_files(path, manifest, read.world_size, checksummed);
  return read;
}

// What one rank read of a checkpoint, checked, before anything is loaded into the job.
struct checkpointer::read_files {
  fs::path path;
  checkpoint_manifest manifest;
  bool resharding = false;
  std::string described;               // "its file 'rank-00001.safetensors'", for a message
  std::vector<tensor_state> models;    // one a file read: this rank's, or one whole copy's
  std::vector<at::Tensor> optimizers;  // the optimizer's archive of each
  std::vector<named_tensor> generators;
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
  files.resharding = target.sharded && (saved_world != rt_.world_size() || saved_group != target.shard_group_size);
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

  // The files this rank reads: its own, or under a replicating strategy rank 0's, or when resharding
  // those of one whole copy: the old ranks of the first shard group (every old rank without hybrid
  // sharding; the other groups hold the same rows).
  std::vector<int> sources;
  if (files.resharding) {
    for (int rank = 0; rank < saved_group; ++rank) sources.push_back(rank);
  } else {
    sources.push_back(target.sharded ? rt_.rank() : 0);
  }
  // Each file read once, checked against its checksum as it is read; the generators come from this
  // rank's own (below), which may be one of them.
  const auto checked = [&](int rank) {
    const std::string file = rank_file(rank).string();
    safetensors_content content;
    try {
      content = load_safetensors(path / file);
    } catch (const safetensors_error& error) {
      damaged(path, fmt::format("its file '{}' is not what its save wrote: {}", file, error_text(error)));
    } catch (const file_error& error) {
      damaged(path, fmt::format("its file '{}' cannot be read: {}", file, error_text(error)));
    }
    const file_digest& recorded = manifest.files.at(file);
    if (manifest.checksummed && content.digest != recorded) {
      damaged(path, fmt::format("its file '{}' does not match the checksum its manifest records (written {}, read {}): "
                                "it was damaged or replaced after the save",
                                file, hex(recorded.xxh3), hex(content.digest.xxh3)));
    }
    return std::move(content.tensors);
  };
  const int own_source = rt_.rank() % saved_world;
  const auto take_generators = [&](std::vector<named_tensor>& tensors) {
    for (named_tensor& t : tensors) {
      if (t.name.starts_with(rng_prefix)) files.generators.push_back(std::move(t));
    }
  };
  for (int rank : sources) {
    std::vector<named_tensor> tensors = checked(rank);
    tensor_state& model = files.models.emplace_back();
    for (named_tensor& t : tensors) {
      if (t.name.starts_with(model_prefix)) model.push_back({t.name.substr(model_prefix.size()), std::move(t.tensor)});
      if (t.name == optimizer_key) files.optimizers.push_back(std::move(t.tensor));
    }
    if (files.optimizers.size() != files.models.size()) {
      unusable(path, fmt::format("its file '{}' holds no optimizer state", rank_file(rank).string()));
    }
    if (rank == own_source) take_generators(tensors);
  }
  if (std::find(sources.begin(), sources.end(), own_source) == sources.end()) {
    std::vector<named_tensor> tensors = checked(own_source);
    take_generators(tensors);
  }
  files.described = files.resharding ? fmt::format("the files of its {} ranks", saved_group)
                                     : fmt::format("its file '{}'", rank_file(sources.front()).string());
  return files;
}

resume_point checkpointer::load(const read_files& files, const checkpoint_target& target,
                                torch::optim::Optimizer& optimizer) const {
  const auto bad = [&](const std::string& problem) { unusable(files.path, problem); };
  const bool resharding = files.resharding;
  try {
    target.load(with_current(target, resharding ? resharded_model(target, files.models) : files.models.front()));
  } catch (const std::exception& error) {
    bad(fmt::format("{} do{} not fit this model: {}", files.described, resharding ? "" : "es", error_text(error)));
  }
  try {
    if (resharding) {
      load_resharded_optimizer(target, optimizer, files.optimizers);
    } else {
      load_optimizer(optimizer, files.optimizers.front());
    }
  } catch (const std::exception& error) {
    bad(fmt::format("{} hold{} an optimizer state that does not fit this optimizer: {}", files.described,
                    resharding ? "" : "s", error_text(error)));
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
  return {files.manifest.step, files.manifest.user_state, files.path};
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

tensor_state checkpointer::resharded_model(const checkpoint_target& target, const std::vector<tensor_state>& old) {
  tensor_state mine;
  for (std::size_t i = 0; i < old.front().size(); ++i) {
    const std::string& name = old.front()[i].name;
    std::vector<at::Tensor> shards;
    for (const tensor_state& rank_state : old) {
      if (i >= rank_state.size() || rank_state[i].name != name) {
        throw_error<checkpoint_error>("the old ranks' files list different tensors at '{}'", name);
      }
      shards.push_back(rank_state[i].tensor);
    }
    // Sharded: this rank's rows of the old shards; whole on every rank (an adapter, a buffer): rank 0's.
    mine.push_back({name, target.reshard(name, shards).value_or(old.front()[i].tensor)});
  }
  return mine;
}

void checkpointer::load_resharded_optimizer(const checkpoint_target& target, torch::optim::Optimizer& optimizer,
                                            const std::vector<at::Tensor>& old) {
  std::vector<at::Tensor> parameters;
  for (const auto& group : optimizer.param_groups()) {
    for (const at::Tensor& p : group.params()) parameters.push_back(p);
  }
  if (parameters.size() != target.optimizer_names.size()) {
    throw_error<checkpoint_error>("the optimizer steps {} tensors, the job trains {}", parameters.size(),
                                  target.optimizer_names.size());
  }
  // Each old rank's state, loaded in turn (the optimizer maps it to the parameters by position), to
  // collect every field's shards.
  std::vector<std::map<std::string, std::vector<at::Tensor>>> shards(parameters.size());
  for (const at::Tensor& bytes : old) {
    load_optimizer(optimizer, bytes);
    for (std::size_t j = 0; j < parameters.size(); ++j) {
      const auto state = optimizer.state().find(parameters[j].unsafeGetTensorImpl());
      if (state == optimizer.state().end()) continue;
      for (const auto& [key, value] : state_fields(*state->second)) {
        if (value.isTensor()) shards[j][key].push_back(value.toTensor().clone());
      }
    }
  }
  // Rank 0's state for the options and every field that is not per element (a step), then this
  // rank's rows of each field laid out as its parameter.
  load_optimizer(optimizer, old.front());
  for (std::size_t j = 0; j < parameters.size(); ++j) {
    const auto state = optimizer.state().find(parameters[j].unsafeGetTensorImpl());
    if (state == optimizer.state().end()) continue;
    auto fields = state_fields(*state->second);
    for (auto& [key, value] : fields) {
      const auto field = shards[j].find(key);
      if (field == shards[j].end() || field->second.size() != old.size()) continue;
      if (auto mine = target.reshard(target.optimizer_names[j], field->second)) value = *mine;
    }
    set_state_fields(*state->second, fields);
  }
}

}  // namespace loom

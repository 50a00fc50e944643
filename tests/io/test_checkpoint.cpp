// Checkpoints on a single process: what is kept, what is cleaned, every checkpoint that cannot be
// resumed refused with its path, its file and the difference, a damaged one set aside for the one
// before it, and an asynchronous save equal to a synchronous one. (Resuming bit for bit across
// processes and ranks: tests/dist/resume_check.py; damage across ranks: checkpoint_damage.py.)
#include <loom/loom.hpp>
#include "single_process.hpp"

#include <models/tiny_gpt.hpp>

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <fmt/format.h>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_exception.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

using Catch::Matchers::ContainsSubstring;

namespace {

namespace fs = std::filesystem;

constexpr models::tiny_gpt_config small = loom::testing::small_gpt;
using loom::testing::one;

fs::path scratch(const std::string& name) { return loom::testing::scratch("loom-test-checkpoint", name); }

template <class Job>
void train_step(Job& job, torch::optim::Optimizer& optimizer, std::uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const at::Tensor x = torch::randint(0, small.vocab, {2, small.ctx}, gen);
  job.backward(job.forward(x, x.roll(-1, 1)));
  optimizer.step();
  job.zero_grad();
}

std::vector<std::string> entries(const fs::path& folder) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(folder)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

constexpr auto plan = loom::model<models::TinyGpt>(small) | loom::seeded(1) | loom::lora(4, {"q_proj"});

std::string read_text(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void write_text(const fs::path& file, const std::string& text) {
  std::ofstream(file, std::ios::binary | std::ios::trunc) << text;
}

// The manifest as a person or a tool would edit it, sealed again with its own checksum (XXH3-64 of
// the manifest without it, as dump(2) writes it) so that the reader gets to the field under test.
void write_sealed(const fs::path& file, nlohmann::json manifest) {
  manifest.erase("manifest_xxh3");
  const std::string body = manifest.dump(2);
  manifest["manifest_xxh3"] = fmt::format("{:016x}", loom::xxh3_of(body.data(), body.size()));
  write_text(file, manifest.dump(2) + "\n");
}

// Flips one bit in the middle of the bytes of the first tensor whose name starts with `prefix`.
void flip_bit(const fs::path& file, const std::string& prefix) {
  std::string bytes = read_text(file);
  std::uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i) header_length = (header_length << 8) | static_cast<unsigned char>(bytes[i]);
  const auto header = nlohmann::json::parse(bytes.substr(8, header_length));
  for (const auto& [name, spec] : header.items()) {
    if (!name.starts_with(prefix)) continue;
    const auto begin = spec["data_offsets"][0].get<std::uint64_t>(), end = spec["data_offsets"][1].get<std::uint64_t>();
    if (begin == end) continue;
    bytes[8 + header_length + (begin + end) / 2] ^= 0x10;
    write_text(file, bytes);
    return;
  }
  FAIL("no tensor named " << prefix << "... in " << file);
}

}  // namespace

TEST_CASE("a checkpoint keeps the newest k, resumes the newest, and cleans an interrupted save", "[checkpoint]") {
  const fs::path folder = scratch("keep");
  auto job = loom::build(plan, one());
  torch::optim::AdamW optimizer(job.trainable_parameters());
  {
    loom::checkpointer checkpoints(one(), {.folder = folder});
    CHECK_FALSE(checkpoints.resume(job, optimizer).has_value());
    for (std::int64_t step = 1; step <= 3; ++step) {
      train_step(job, optimizer, step);
      checkpoints.save(job, optimizer, 4 * step, R"({"cursor": )" + std::to_string(step) + "}");
    }
    CHECK(entries(folder) == std::vector<std::string>{"step-00000008", "step-00000012"});
    CHECK_THROWS_WITH(checkpoints.save(job, optimizer, 16, "{cursor"), ContainsSubstring("user_state is not JSON"));
  }
  fs::create_directories(folder / "step-00000016.tmp");
  std::ofstream(folder / "step-00000016.tmp" / "rank-00000.safetensors") << "half a file";

  loom::checkpointer again(one(), {.folder = folder});
  CHECK(entries(folder) == std::vector<std::string>{"step-00000008", "step-00000012"});
  auto resumed_job = loom::build(plan, one());
  torch::optim::AdamW resumed_optimizer(resumed_job.trainable_parameters());
  const auto resumed = again.resume(resumed_job, resumed_optimizer);
  REQUIRE(resumed.has_value());
  CHECK(resumed->step == 12);
  CHECK(resumed->user_state == R"({"cursor":3})");
  const auto expected = job.state_dict(), actual = resumed_job.state_dict();
  for (std::size_t i = 0; i < expected.size(); ++i) CHECK(torch::equal(expected[i].tensor, actual[i].tensor));
}

TEST_CASE("a checkpoint that cannot be resumed is refused with its path, its file and the difference",
          "[checkpoint][errors]") {
  const fs::path folder = scratch("refused");
  {
    auto job = loom::build(plan, one());
    torch::optim::AdamW optimizer(job.trainable_parameters());
    loom::checkpointer checkpoints(one(), {.folder = folder});
    train_step(job, optimizer, 1);
    checkpoints.save(job, optimizer, 4);
  }
  const fs::path saved = folder / "step-00000004";
  const auto resume_with = [&](auto another_plan) {
    auto job = loom::build(another_plan, one());
    torch::optim::AdamW optimizer(job.trainable_parameters());
    loom::checkpointer checkpoints(one(), {.folder = folder});
    (void)checkpoints.resume(job, optimizer);
  };
  CHECK_THROWS_WITH(resume_with(loom::model<models::TinyGpt>(small) | loom::seeded(1) | loom::lora(8, {"q_proj"})),
                    ContainsSubstring("the checkpoint '" + saved.string() +
                                      "' cannot be resumed: it was saved by "
                                      "another plan: saved '") &&
                        ContainsSubstring("rank=4") && ContainsSubstring("rank=8"));

  {
    // The same plan whose schedule differs (say, a LibTorch with other bucket rules): edited here.
    std::ifstream in(saved / "manifest.json");
    std::string manifest((std::istreambuf_iterator<char>(in)), {});
    const auto at = manifest.find("\"schedule_fingerprint\": \"");
    REQUIRE(at != std::string::npos);
    const std::string original = manifest.substr(at + 25, 16);
    manifest.replace(at + 25, 16, "0123456789abcdef");
    write_sealed(saved / "manifest.json", nlohmann::json::parse(manifest));
    CHECK_THROWS_WITH(resume_with(plan),
                      ContainsSubstring("its schedule's fingerprint is 0123456789abcdef, this job's " + original) &&
                          ContainsSubstring("give it a folder of its own (loom::train's out; --train.out=DIR with a "
                                            "run file) or remove '" +
                                            folder.string() + "'"));
    // With the saved run's collectives recorded, the message says which differs.
    nlohmann::json with_schedule = nlohmann::json::parse(manifest);
    with_schedule["schedule"] = "all_reduce backward world 64 B [lm_head.weight Float[16]]\n";
    write_sealed(saved / "manifest.json", with_schedule);
    CHECK_THROWS_WITH(resume_with(plan), ContainsSubstring("its step's collectives are not this job's: a step had 1 "
                                                           "collective in the saved run, 0 collectives in this job"));
    manifest.replace(at + 25, 16, original);
    write_sealed(saved / "manifest.json", nlohmann::json::parse(manifest));
  }

  const fs::path file = saved / "rank-00000.safetensors";
  const auto size = fs::file_size(file);
  fs::resize_file(file, size - 3);
  CHECK_THROWS_WITH(resume_with(plan), ContainsSubstring("its file 'rank-00000.safetensors' is " +
                                                         std::to_string(size - 3) + " bytes, the manifest says " +
                                                         std::to_string(size) + ": truncated or overwritten"));
  fs::remove(file);
  CHECK_THROWS_WITH(resume_with(plan), ContainsSubstring("its file 'rank-00000.safetensors' is missing"));

  CHECK_THROWS_WITH(loom::checkpointer(one(), {.folder = "/proc/loom-cannot-be-here"}),
                    ContainsSubstring("the checkpoint folder '/proc/loom-cannot-be-here' cannot be created"));
  CHECK_THROWS_WITH(loom::checkpointer(one(), {.folder = folder, .keep = 0}), ContainsSubstring("keep at least 1"));
}

TEST_CASE("a manifest that is not what a save writes is refused, naming the checkpoint and its field",
          "[checkpoint][errors]") {
  const fs::path folder = scratch("manifest");
  auto job = loom::build(plan, one());
  torch::optim::AdamW optimizer(job.trainable_parameters());
  loom::checkpointer checkpoints(one(), {.folder = folder});
  checkpoints.save(job, optimizer, 4, R"({"cursor": 12})");
  const fs::path saved = folder / "step-00000004";
  std::ifstream in(saved / "manifest.json");
  const std::string original((std::istreambuf_iterator<char>(in)), {});

  const loom::checkpoint_manifest read = loom::read_checkpoint_manifest(saved);
  CHECK(read.step == 4);
  CHECK(read.world_size == 1);
  CHECK_FALSE(read.sharded);
  CHECK_FALSE(read.all_parameters);
  CHECK(read.plan == job.plan_text());
  CHECK(read.user_state == R"({"cursor":12})");

  // The saved manifest with `from` replaced by `to`, sealed again when it is still a JSON object.
  const auto edited = [&](const std::string& from, const std::string& to, bool sealed = true) {
    std::string manifest = original;
    const auto at = manifest.find(from);
    REQUIRE(at != std::string::npos);
    manifest.replace(at, from.size(), to);
    const auto parsed = nlohmann::json::parse(manifest, nullptr, false);
    if (sealed && parsed.is_object()) {
      write_sealed(saved / "manifest.json", parsed);
    } else {
      write_text(saved / "manifest.json", manifest);
    }
    return saved;
  };
  const auto refused = [&](const std::string& from, const std::string& to, const std::string& problem,
                           bool sealed = true) {
    CAPTURE(to);
    CHECK_THROWS_MATCHES(loom::read_checkpoint_manifest(edited(from, to, sealed)), loom::checkpoint_error,
                         Catch::Matchers::MessageMatches(ContainsSubstring("the checkpoint '" + saved.string() +
                                                                           "' cannot be resumed: " + problem)));
  };
  refused("{", "[", "its manifest.json is not JSON");
  refused(R"("format": "loom checkpoint v2")", R"("format": 1)", "its manifest is not a loom checkpoint's");
  // An edit that is not sealed again: the manifest is not what its save wrote.
  refused(R"("step": 4)", R"("step": 5)", "its manifest.json does not match its own checksum (written ", false);
  refused(R"("manifest_xxh3": ")", R"("manifest_xxh3": "z)", "its manifest has no manifest_xxh3 of 16 hex digits",
          false);
  refused(R"("xxh3": ")", R"("xxh3": "0x)",
          R"(its manifest gives 'rank-00000.safetensors' as an object, not {"bytes": …, "xxh3": "<16 hex digits>"})");
  // What the fuzzer found (tests/fuzz/corpus/manifest): a field of another kind escaped as nlohmann's
  // type_error, naming no checkpoint.
  refused(R"("plan": )", R"("plan": 3, "was": )", "its manifest's plan is 3, not a string");
  refused(R"("sharded": false)", R"("sharded": "no")", R"(its manifest's sharded is "no", not true or false)");
  refused(R"("step": 4)", R"("step": -4)", "its manifest's step is -4, not a step number");
  refused(R"("parameters": "trainable")", R"("parameters": "some")",
          R"(its manifest's parameters is "some", not "all" or "trainable")");
  refused(R"("user_state": )", R"("state": )", "its manifest has no user_state");
  refused(R"("world_size": 1)", R"("world_size": 2)", "its manifest lists 1 file for its world_size of 2");
  refused(R"("rank-00000.safetensors")", R"("../rank-00000.safetensors")",
          "its manifest lists no file 'rank-00000.safetensors' for rank 0");
  refused(R"("bytes": )", R"("bytes": -)", "its manifest gives the size of 'rank-00000.safetensors' as -");

  // A world_size of 0 divided by zero when the generators were loaded (SIGFPE), once the rest passed.
  edited(R"("world_size": 1)", R"("world_size": 0)");
  auto other = loom::build(plan, one());
  torch::optim::AdamW other_optimizer(other.trainable_parameters());
  CHECK_THROWS_WITH(checkpoints.resume(other, other_optimizer),
                    ContainsSubstring("its manifest's world_size is 0, not a number of ranks"));
}

TEST_CASE("a checkpoint whose tensors do not fit the model names the file and the tensor", "[checkpoint][errors]") {
  const auto replaced = GENERATE(std::pair{"shape", "Float[5]"}, std::pair{"dtype", "Double[4,16]"});
  CAPTURE(replaced.first);
  const fs::path folder = scratch("misfit");
  auto job = loom::build(plan, one());
  torch::optim::AdamW optimizer(job.trainable_parameters());
  loom::checkpointer checkpoints(one(), {.folder = folder});
  checkpoints.save(job, optimizer, 4);
  // The same file with one tensor of another shape or dtype, and the manifest's size of it.
  const fs::path file = folder / "step-00000004" / "rank-00000.safetensors";
  auto content = loom::load_safetensors(file);
  for (auto& t : content.tensors) {
    if (t.name != "model/blocks.0.attn.q_proj.lora_A") continue;
    t.tensor = std::string(replaced.first) == "shape" ? at::zeros({5}) : t.tensor.to(at::kDouble);
  }
  const loom::file_digest digest = loom::save_safetensors(file, content.tensors, content.metadata);
  const fs::path manifest_file = folder / "step-00000004" / "manifest.json";
  auto manifest = nlohmann::json::parse(read_text(manifest_file));
  manifest["files"]["rank-00000.safetensors"] = {{"bytes", digest.bytes},
                                                 {"xxh3", fmt::format("{:016x}", digest.xxh3)}};
  write_sealed(manifest_file, manifest);

  auto other = loom::build(plan, one());
  torch::optim::AdamW other_optimizer(other.trainable_parameters());
  CHECK_THROWS_WITH(checkpoints.resume(other, other_optimizer),
                    ContainsSubstring("its file 'rank-00000.safetensors' does not fit this model") &&
                        ContainsSubstring(std::string("'blocks.0.attn.q_proj.lora_A' is ") + replaced.second +
                                          " in the state but Float[4,16] in the module"));
}

TEST_CASE("a checkpoint of another optimizer is refused", "[checkpoint][errors]") {
  const fs::path folder = scratch("optimizer");
  auto job = loom::build(plan, one());
  torch::optim::AdamW optimizer(job.trainable_parameters());
  loom::checkpointer checkpoints(one(), {.folder = folder});
  checkpoints.save(job, optimizer, 4);
  torch::optim::SGD sgd(job.trainable_parameters(), 0.1);
  CHECK_THROWS_WITH(checkpoints.resume(job, sgd), ContainsSubstring("holds an optimizer state that does not fit"));
}

TEST_CASE("a checkpoint holds the trainable parameters, or every one when asked", "[checkpoint]") {
  auto job = loom::build(plan, one());
  torch::optim::AdamW optimizer(job.trainable_parameters());
  const auto saved_names = [&](bool all) {
    const fs::path folder = scratch(all ? "all" : "trainable");
    loom::checkpointer(one(), {.folder = folder, .all_parameters = all}).save(job, optimizer, 1);
    std::set<std::string> names;
    for (const auto& t : loom::load_safetensors(folder / "step-00000001" / "rank-00000.safetensors").tensors) {
      if (t.name.starts_with("model/")) names.insert(t.name.substr(6));
    }
    return names;
  };
  const std::set<std::string> adapters{"blocks.0.attn.q_proj.lora_A", "blocks.0.attn.q_proj.lora_B",
                                       "blocks.1.attn.q_proj.lora_A", "blocks.1.attn.q_proj.lora_B"};
  CHECK(saved_names(false) == adapters);
  CHECK(saved_names(true).size() == job.state_dict().size());
}

TEST_CASE("a damaged newest checkpoint is set aside and the one before it resumes bit for bit",
          "[checkpoint][damage]") {
  const std::string damage =
      GENERATE("a weight", "the optimizer's archive", "the generator", "the manifest", "a file of another step");
  CAPTURE(damage);
  const fs::path folder = scratch("damaged");
  auto job = loom::build(plan, one());
  torch::optim::AdamW optimizer(job.trainable_parameters());
  loom::tensor_state at_step_4;
  {
    loom::checkpointer checkpoints(one(), {.folder = folder});
    train_step(job, optimizer, 1);
    checkpoints.save(job, optimizer, 4);
    for (const auto& t : job.state_dict()) at_step_4.push_back({t.name, t.tensor.clone()});
    train_step(job, optimizer, 2);
    checkpoints.save(job, optimizer, 8);
  }
  const fs::path step8 = folder / "step-00000008";
  const fs::path file = step8 / "rank-00000.safetensors";
  if (damage == "a weight") flip_bit(file, "model/");
  if (damage == "the optimizer's archive") flip_bit(file, "optimizer");
  if (damage == "the generator") flip_bit(file, "rng/");
  if (damage == "the manifest") {
    std::string manifest = read_text(step8 / "manifest.json");
    const auto at = manifest.find("lora(");
    REQUIRE(at != std::string::npos);
    manifest[at] ^= 0x20;  // 'l' becomes 'L': still JSON, no longer what was saved
    write_text(step8 / "manifest.json", manifest);
  }
  if (damage == "a file of another step") {
    REQUIRE(fs::file_size(folder / "step-00000004" / "rank-00000.safetensors") == fs::file_size(file));
    fs::copy_file(folder / "step-00000004" / "rank-00000.safetensors", file, fs::copy_options::overwrite_existing);
  }

  const auto resume_into = [&](auto& other, auto& other_optimizer, bool strict) {
    loom::checkpointer checkpoints(one(), {.folder = folder, .strict = strict});
    return checkpoints.resume(other, other_optimizer);
  };
  {
    auto refused = loom::build(plan, one());
    torch::optim::AdamW refused_optimizer(refused.trainable_parameters());
    CHECK_THROWS_WITH(resume_into(refused, refused_optimizer, true),
                      ContainsSubstring("the checkpoint '" + step8.string() + "' is damaged: its ") &&
                          ContainsSubstring(damage == "the manifest" ? "manifest.json does not match its own checksum"
                                                                     : "file 'rank-00000.safetensors' does not match "
                                                                       "the checksum its manifest records") &&
                          ContainsSubstring("checkpoint_options.strict refuses to fall back, so the run stops before "
                                            "any step"));
    CHECK(fs::exists(step8));
  }
  auto resumed = loom::build(plan, one());
  torch::optim::AdamW resumed_optimizer(resumed.trainable_parameters());
  const auto point = resume_into(resumed, resumed_optimizer, false);
  REQUIRE(point.has_value());
  CHECK(point->step == 4);
  CHECK(entries(folder) == std::vector<std::string>{"step-00000004", "step-00000008.damaged"});
  const auto state = resumed.state_dict();
  REQUIRE(state.size() == at_step_4.size());
  for (std::size_t i = 0; i < state.size(); ++i) CHECK(torch::equal(state[i].tensor, at_step_4[i].tensor));
  // The optimizer's state too: the same step from there lands where the first run's step 8 did.
  train_step(resumed, resumed_optimizer, 2);
  const auto expected = job.state_dict(), actual = resumed.state_dict();
  for (std::size_t i = 0; i < expected.size(); ++i) CHECK(torch::equal(expected[i].tensor, actual[i].tensor));

  // Nothing left to fall back to: the run stops before any step, naming the last one tried.
  flip_bit(folder / "step-00000004" / "rank-00000.safetensors", "model/");
  auto stopped = loom::build(plan, one());
  torch::optim::AdamW stopped_optimizer(stopped.trainable_parameters());
  CHECK_THROWS_WITH(resume_into(stopped, stopped_optimizer, false),
                    ContainsSubstring("the checkpoint '" + (folder / "step-00000004").string() + "' is damaged") &&
                        ContainsSubstring("no earlier complete checkpoint is left to fall back to"));
}

TEST_CASE("a checkpoint written before checksums (loom checkpoint v1) still resumes", "[checkpoint]") {
  const fs::path folder = scratch("v1");
  auto job = loom::build(plan, one());
  torch::optim::AdamW optimizer(job.trainable_parameters());
  loom::checkpointer checkpoints(one(), {.folder = folder});
  train_step(job, optimizer, 1);
  checkpoints.save(job, optimizer, 4);
  const fs::path manifest_file = folder / "step-00000004" / "manifest.json";
  auto manifest = nlohmann::json::parse(read_text(manifest_file));
  manifest["format"] = "loom checkpoint v1";
  manifest.erase("manifest_xxh3");
  manifest["files"]["rank-00000.safetensors"] = manifest["files"]["rank-00000.safetensors"]["bytes"];
  write_text(manifest_file, manifest.dump(2));
  const loom::checkpoint_manifest read = loom::read_checkpoint_manifest(folder / "step-00000004");
  CHECK_FALSE(read.checksummed);
  CHECK(read.files.at("rank-00000.safetensors").bytes ==
        fs::file_size(folder / "step-00000004" / "rank-00000.safetensors"));
  auto resumed = loom::build(plan, one());
  torch::optim::AdamW resumed_optimizer(resumed.trainable_parameters());
  REQUIRE(checkpoints.resume(resumed, resumed_optimizer).has_value());
  const auto expected = job.state_dict(), actual = resumed.state_dict();
  for (std::size_t i = 0; i < expected.size(); ++i) CHECK(torch::equal(expected[i].tensor, actual[i].tensor));
}

TEST_CASE("an asynchronous save holds what a synchronous one does, from the state at save()", "[checkpoint][async]") {
  auto job = loom::build(plan, one());
  torch::optim::AdamW optimizer(job.trainable_parameters());
  train_step(job, optimizer, 1);
  const fs::path sync_folder = scratch("sync"), async_folder = scratch("async");
  loom::checkpointer sync(one(), {.folder = sync_folder});
  sync.save(job, optimizer, 4);
  loom::checkpointer background(one(), {.folder = async_folder, .async_save = true});
  background.save(job, optimizer, 4);
  CHECK(background.saving());
  train_step(job, optimizer, 2);  // changes the parameters and AdamW's moments while the file may be written
  while (background.saving()) background.poll();

  // The model's tensors and the generator byte for byte; the optimizer's archive (whose pickle may
  // number its objects otherwise) by what it loads: the same step from both lands on the same state.
  const auto tensors_of = [](const fs::path& folder) {
    return loom::load_safetensors(folder / "step-00000004" / "rank-00000.safetensors").tensors;
  };
  const auto written = tensors_of(async_folder), expected = tensors_of(sync_folder);
  REQUIRE(written.size() == expected.size());
  for (std::size_t i = 0; i < written.size(); ++i) {
    CAPTURE(expected[i].name);
    CHECK(written[i].name == expected[i].name);
    if (expected[i].name != "optimizer") CHECK(torch::equal(written[i].tensor, expected[i].tensor));
  }
  const auto resumed_from = [&](const fs::path& folder) {
    auto resumed = loom::build(plan, one());
    torch::optim::AdamW resumed_optimizer(resumed.trainable_parameters());
    REQUIRE(loom::checkpointer(one(), {.folder = folder}).resume(resumed, resumed_optimizer).has_value());
    train_step(resumed, resumed_optimizer, 2);
    return resumed.state_dict();
  };
  const auto from_async = resumed_from(async_folder), from_sync = resumed_from(sync_folder), now = job.state_dict();
  for (std::size_t i = 0; i < now.size(); ++i) {
    CHECK(torch::equal(from_async[i].tensor, from_sync[i].tensor));
    CHECK(torch::equal(from_async[i].tensor, now[i].tensor));
  }

  // The next save waits for the one in flight; wait() completes it. Every save stages into the
  // host buffers the first one made: the model's tensors and AdamW's moments, at the same addresses.
  const std::vector<const void*> first_buffers = background.staging_addresses();
  CHECK(first_buffers.size() >= 2 * job.trainable_parameters().size());
  background.save(job, optimizer, 8);
  CHECK(background.staging_addresses() == first_buffers);
  background.save(job, optimizer, 12);
  CHECK(background.staging_addresses() == first_buffers);
  background.wait();
  CHECK_FALSE(background.saving());
  CHECK(entries(async_folder) == std::vector<std::string>{"step-00000008", "step-00000012"});
  // A synchronous save of tensors on the CPU writes them as they are: nothing to stage.
  CHECK(sync.staging_addresses().empty());
}

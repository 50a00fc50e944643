// Checkpoints on a single process: what is kept, what is cleaned, and every checkpoint that cannot
// be resumed refused with its path, its file and the difference. (Resuming bit for bit across
// processes and ranks: tests/dist/resume_check.py.)
#include <loom/loom.hpp>
#include "single_process.hpp"

#include <models/tiny_gpt.hpp>

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_exception.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

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
    std::ofstream(saved / "manifest.json") << manifest;
    CHECK_THROWS_WITH(resume_with(plan),
                      ContainsSubstring("its schedule's fingerprint is 0123456789abcdef, this job's " + original));
    manifest.replace(at + 25, 16, original);
    std::ofstream(saved / "manifest.json") << manifest;
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

  // The saved manifest with `from` replaced by `to`.
  const auto edited = [&](const std::string& from, const std::string& to) {
    std::string manifest = original;
    const auto at = manifest.find(from);
    REQUIRE(at != std::string::npos);
    manifest.replace(at, from.size(), to);
    std::ofstream(saved / "manifest.json") << manifest;
    return saved;
  };
  const auto refused = [&](const std::string& from, const std::string& to, const std::string& problem) {
    CAPTURE(to);
    CHECK_THROWS_MATCHES(loom::read_checkpoint_manifest(edited(from, to)), loom::checkpoint_error,
                         Catch::Matchers::MessageMatches(ContainsSubstring("the checkpoint '" + saved.string() +
                                                                           "' cannot be resumed: " + problem)));
  };
  refused("{", "[", "its manifest.json is not JSON");
  refused(R"("format": "loom checkpoint v1")", R"("format": 1)", "its manifest is not a loom checkpoint's");
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
  refused(R"("rank-00000.safetensors": )", R"("rank-00000.safetensors": -)",
          "its manifest gives the size of 'rank-00000.safetensors' as -");

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
  loom::save_safetensors(file, content.tensors, content.metadata);
  std::ifstream in(folder / "step-00000004" / "manifest.json");
  std::string manifest((std::istreambuf_iterator<char>(in)), {});
  const auto at = manifest.find("\"rank-00000.safetensors\": ");
  REQUIRE(at != std::string::npos);
  const auto end = manifest.find_first_of(",\n}", at + 26);
  manifest.replace(at + 26, end - at - 26, std::to_string(fs::file_size(file)));
  std::ofstream(folder / "step-00000004" / "manifest.json") << manifest;

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

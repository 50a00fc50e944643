#include <loom/runtime/launch_env.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <map>
#include <optional>
#include <string>
#include <vector>

using Catch::Matchers::ContainsSubstring;
using loom::launch_env;
using loom::parse_launch_env;

namespace {

using variables = std::map<std::string, std::string>;

loom::env_lookup lookup(const variables& vars) {
  return [vars](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
}

variables torchrun(int rank, int world) {
  return {{"RANK", std::to_string(rank)},        {"LOCAL_RANK", std::to_string(rank)},
          {"WORLD_SIZE", std::to_string(world)}, {"LOCAL_WORLD_SIZE", std::to_string(world)},
          {"MASTER_ADDR", "127.0.0.1"},          {"MASTER_PORT", "29500"}};
}

variables with(variables vars, const std::string& name, const std::string& value) {
  vars[name] = value;
  return vars;
}

variables without(variables vars, const std::string& name) {
  vars.erase(name);
  return vars;
}

std::string error_for(const variables& vars) {
  try {
    (void)parse_launch_env(lookup(vars));
  } catch (const loom::launch_error& error) {
    return error.what();
  }
  FAIL("parse_launch_env accepted an invalid environment");
  return {};
}

}  // namespace

TEST_CASE("no launcher variables mean a single process", "[launch_env]") {
  launch_env env = parse_launch_env(lookup({}));
  CHECK(env.world_size == 1);
  CHECK(env.rank == 0);
  CHECK_FALSE(env.is_distributed());
  CHECK(env.master_addr.empty());
  CHECK(env.timeout == launch_env::default_timeout);
  CHECK_FALSE(env.backend.has_value());
}

TEST_CASE("torchrun's variables are read", "[launch_env]") {
  launch_env env = parse_launch_env(lookup(with(torchrun(2, 3), "LOCAL_RANK", "0")));
  CHECK(env.rank == 2);
  CHECK(env.local_rank == 0);
  CHECK(env.world_size == 3);
  CHECK(env.local_world_size == 3);
  CHECK(env.master_addr == "127.0.0.1");
  CHECK(env.master_port == 29500);
  CHECK(env.is_distributed());
  CHECK_FALSE(env.agent_store);
}

TEST_CASE("the agent store and its attempt are read", "[launch_env]") {
  auto vars = with(with(torchrun(1, 2), "TORCHELASTIC_USE_AGENT_STORE", "True"), "TORCHELASTIC_RESTART_COUNT", "3");
  launch_env env = parse_launch_env(lookup(vars));
  CHECK(env.agent_store);
  CHECK(env.restart_count == 3);
  CHECK_THAT(error_for(with(vars, "TORCHELASTIC_USE_AGENT_STORE", "maybe")),
             ContainsSubstring("TORCHELASTIC_USE_AGENT_STORE=\"maybe\"") && ContainsSubstring("True or False"));
}

TEST_CASE("LOCAL_RANK and LOCAL_WORLD_SIZE default to a single node", "[launch_env]") {
  auto vars = without(without(torchrun(1, 2), "LOCAL_RANK"), "LOCAL_WORLD_SIZE");
  launch_env env = parse_launch_env(lookup(vars));
  CHECK(env.local_rank == 1);
  CHECK(env.local_world_size == 2);
}

TEST_CASE("LOOM_BACKEND and LOOM_TIMEOUT_S are read", "[launch_env]") {
  launch_env env = parse_launch_env(lookup({{"LOOM_BACKEND", "gloo"}, {"LOOM_TIMEOUT_S", "2.5"}}));
  CHECK(env.backend == loom::backend_kind::gloo);
  CHECK(env.timeout == std::chrono::milliseconds(2500));
  CHECK(parse_launch_env(lookup({{"LOOM_BACKEND", "nccl"}})).backend == loom::backend_kind::nccl);
}

TEST_CASE("LOOM_HANG_CHECK_S is a number of seconds, 0 turning the check off", "[launch_env]") {
  CHECK(parse_launch_env(lookup({})).hang_check == launch_env::default_hang_check);
  CHECK(parse_launch_env(lookup({{"LOOM_HANG_CHECK_S", "2"}})).hang_check == std::chrono::seconds(2));
  CHECK(parse_launch_env(lookup({{"LOOM_HANG_CHECK_S", "0"}})).hang_check == std::chrono::milliseconds(0));
  for (const char* bad : {"-1", "soon", "", "nan"}) {
    CHECK_THROWS_WITH(parse_launch_env(lookup({{"LOOM_HANG_CHECK_S", bad}})),
                      Catch::Matchers::ContainsSubstring("LOOM_HANG_CHECK_S") &&
                          Catch::Matchers::ContainsSubstring("or 0 to turn the check off"));
  }
}

TEST_CASE("TORCH_SHOW_CPP_STACKTRACES is read as PyTorch reads it", "[launch_env]") {
  CHECK_FALSE(parse_launch_env(lookup({})).show_cpp_stack_traces);
  CHECK_FALSE(parse_launch_env(lookup({{"TORCH_SHOW_CPP_STACKTRACES", "0"}})).show_cpp_stack_traces);
  CHECK(parse_launch_env(lookup({{"TORCH_SHOW_CPP_STACKTRACES", "1"}})).show_cpp_stack_traces);
  CHECK_THROWS_WITH(parse_launch_env(lookup({{"TORCH_SHOW_CPP_STACKTRACES", "yes"}})),
                    ContainsSubstring("TORCH_SHOW_CPP_STACKTRACES") && ContainsSubstring("0 or 1"));
}

TEST_CASE("LOOM_DEVICE names the CPU, each rank's GPU or one GPU", "[launch_env]") {
  CHECK_FALSE(parse_launch_env(lookup({})).device.has_value());
  const auto cpu = parse_launch_env(lookup({{"LOOM_DEVICE", "cpu"}})).device;
  REQUIRE(cpu);
  CHECK_FALSE(cpu->cuda);
  const auto per_rank = parse_launch_env(lookup({{"LOOM_DEVICE", "cuda"}})).device;
  REQUIRE(per_rank);
  CHECK(per_rank->cuda);
  CHECK_FALSE(per_rank->names_index());
  const auto shared = parse_launch_env(lookup({{"LOOM_DEVICE", "cuda:3"}})).device;
  REQUIRE(shared);
  CHECK(shared->index == 3);
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:1x", "CUDA"}) {
    CAPTURE(bad);
    CHECK_THAT(error_for({{"LOOM_DEVICE", bad}}),
               ContainsSubstring("LOOM_DEVICE=\"" + std::string(bad) + "\"") && ContainsSubstring("cuda:N"));
  }
}

TEST_CASE("a malformed variable is named with its accepted form", "[launch_env]") {
  const auto good = torchrun(0, 2);
  struct bad_case {
    std::string name, value, expected;
  };
  auto [name, value, expected] =
      GENERATE(bad_case{"RANK", "abc", "non-negative integer"}, bad_case{"RANK", "-1", "non-negative integer"},
               bad_case{"RANK", "1x", "non-negative integer"}, bad_case{"WORLD_SIZE", "0", "positive integer"},
               bad_case{"WORLD_SIZE", "", "positive integer"}, bad_case{"MASTER_PORT", "70000", "1 to 65535"},
               bad_case{"MASTER_PORT", "0", "1 to 65535"}, bad_case{"MASTER_PORT", "http", "1 to 65535"},
               bad_case{"LOCAL_RANK", "2", "below LOCAL_WORLD_SIZE"},
               bad_case{"LOOM_TIMEOUT_S", "0", "positive number of seconds"},
               bad_case{"LOOM_TIMEOUT_S", "soon", "positive number of seconds"},
               bad_case{"LOOM_BACKEND", "mpi", "gloo (CPU tensors) or nccl (CUDA tensors)"});
  CAPTURE(name, value);
  CHECK_THAT(error_for(with(good, name, value)),
             ContainsSubstring(name + "=\"" + value + "\"") && ContainsSubstring(expected));
}

TEST_CASE("one process needs no MASTER_ADDR", "[launch_env]") {
  const launch_env env = parse_launch_env(lookup({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"LOCAL_RANK", "0"}}));
  CHECK(env.world_size == 1);
  CHECK_FALSE(env.is_launched());
  CHECK_FALSE(env.needs_process_group());
  CHECK_THAT(error_for(without(torchrun(0, 2), "MASTER_ADDR")), ContainsSubstring("MASTER_ADDR is not set"));
}

TEST_CASE("RANK must be below WORLD_SIZE", "[launch_env]") {
  CHECK_THAT(error_for(with(torchrun(0, 2), "RANK", "2")), ContainsSubstring("RANK=2 is not below WORLD_SIZE=2"));
}

TEST_CASE("a missing variable is named, with the launcher that sets it", "[launch_env]") {
  auto name = GENERATE(as<std::string>{}, "WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT");
  CAPTURE(name);
  CHECK_THAT(error_for(without(torchrun(0, 2), name)),
             ContainsSubstring(name + " is not set") && ContainsSubstring("loom-run or torchrun"));
}

TEST_CASE("ProcessGroupNCCL's safety nets follow loom's timeout, and a user's own values are kept", "[launch_env]") {
  const launch_env env = parse_launch_env(lookup({{"LOOM_TIMEOUT_S", "120"}}));
  const auto value_of = [](const std::vector<loom::environment_setting>& settings, const std::string& name) {
    for (const auto& setting : settings) {
      if (setting.name == name) return std::optional<std::string>(setting.value);
    }
    return std::optional<std::string>();
  };
  const auto defaults = loom::nccl_environment(env, lookup({}));
  CHECK(value_of(defaults, "TORCH_NCCL_ASYNC_ERROR_HANDLING") == "3");
  CHECK(value_of(defaults, "TORCH_NCCL_BLOCKING_WAIT") == "0");
  CHECK(value_of(defaults, "TORCH_NCCL_DUMP_ON_TIMEOUT") == "1");
  CHECK(value_of(defaults, "TORCH_NCCL_TRACE_BUFFER_SIZE") == "2000");
  CHECK(value_of(defaults, "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC") == "180");  // the timeout and a minute to report
  const auto user = loom::nccl_environment(
      env, lookup({{"TORCH_NCCL_TRACE_BUFFER_SIZE", "0"}, {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"}}));
  CHECK_FALSE(value_of(user, "TORCH_NCCL_TRACE_BUFFER_SIZE"));
  CHECK_FALSE(value_of(user, "TORCH_NCCL_ASYNC_ERROR_HANDLING"));
  CHECK(user.size() == defaults.size() - 2);
}

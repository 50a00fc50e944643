// The runtime's failures that need LibTorch: an unreachable master, a missing backend, a step's
// error in a single process.
#include <loom/runtime/failures.hpp>
#include <loom/runtime/runtime.hpp>
#include <loom/schedule/schedule.hpp>

#include <ATen/ATen.h>
#include <gloo/common/error.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_exception.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>

using Catch::Matchers::ContainsSubstring;

namespace {

// A loopback port that nothing listens on (bound, read back, released).
std::uint16_t unused_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address);
  socklen_t length = sizeof address;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(fd);
  return ntohs(address.sin_port);
}

}  // namespace

TEST_CASE("a single process needs no process group", "[runtime]") {
  auto rt = loom::runtime::single_process();
  CHECK(rt.world_size() == 1);
  CHECK_FALSE(rt.is_distributed());
  CHECK_FALSE(rt.process_group());
  CHECK(rt.device().is_cpu());
  auto tensor = at::ones({3});
  rt.comm().all_reduce(tensor, loom::reduce_op::mean).wait();
  CHECK(tensor.sum().item<float>() == 3.0f);
}

TEST_CASE("an unreachable master fails within the timeout, naming it", "[runtime]") {
  loom::launch_env env;
  env.rank = 1;
  env.world_size = 2;
  env.master_addr = "127.0.0.1";
  env.master_port = unused_port();
  env.timeout = std::chrono::seconds(2);
  auto start = std::chrono::steady_clock::now();
  try {
    loom::runtime rt(env);
    FAIL("joined a job whose master does not exist");
  } catch (const loom::launch_error& error) {
    CHECK_THAT(std::string(error.what()),
               ContainsSubstring("could not rendezvous at MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
                                 std::to_string(env.master_port)) &&
                   ContainsSubstring("within 2 s"));
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
}

TEST_CASE("a rendezvous short of ranks says early what it waits for, and at the timeout how many came", "[runtime]") {
  loom::launch_env env;
  env.rank = 0;
  env.world_size = 2;
  env.local_world_size = 1;  // two nodes of one rank: the other never starts
  env.master_addr = "127.0.0.1";
  env.master_port = unused_port();
  env.timeout = std::chrono::seconds(7);
  // stderr into a file for the length of the rendezvous.
  const std::string captured = (std::filesystem::temp_directory_path() / "loom-test-rendezvous.txt").string();
  std::fflush(stderr);
  const int saved = ::dup(STDERR_FILENO);
  const int file = ::open(captured.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ::dup2(file, STDERR_FILENO);
  std::string error;
  try {
    loom::runtime rt(env);
  } catch (const loom::launch_error& failure) {
    error = failure.what();
  }
  std::fflush(stderr);
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  ::close(file);
  std::ifstream in(captured);
  const std::string said((std::istreambuf_iterator<char>(in)), {});
  const std::string where = "127.0.0.1:" + std::to_string(env.master_port);
  CHECK_THAT(said, ContainsSubstring("rank 0 waits for the rendezvous at " + where +
                                     ": 1 of 2 ranks (1 of 2 nodes) have joined; it gives up after 7 s"));
  CHECK_THAT(error, ContainsSubstring("only 1 of 2 ranks (1 of 2 nodes) joined the rendezvous at " + where +
                                      " within 7 s (LOOM_TIMEOUT_S): start loom-run on every node with --nnodes 2"));
}

TEST_CASE("a master address that does not resolve, or a taken port on rank 0, fails at once, naming it", "[runtime]") {
  loom::launch_env env;
  env.world_size = 2;
  env.master_addr = "no-such-host.invalid";
  env.master_port = unused_port();
  env.timeout = std::chrono::seconds(60);  // far beyond the bound below: no waiting
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(loom::runtime(env), ContainsSubstring("MASTER_ADDR=no-such-host.invalid does not resolve"));

  const int holder = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  REQUIRE(::bind(holder, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
  REQUIRE(::listen(holder, 1) == 0);
  socklen_t length = sizeof address;
  ::getsockname(holder, reinterpret_cast<sockaddr*>(&address), &length);
  env.master_addr = "127.0.0.1";
  env.master_port = ntohs(address.sin_port);
  CHECK_THROWS_WITH(loom::runtime(env), ContainsSubstring("MASTER_PORT=" + std::to_string(env.master_port) +
                                                          " is already in use on rank 0's host"));
  ::close(holder);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
}

#ifndef LOOM_HAVE_NCCL
TEST_CASE("asking for a backend or a device this LibTorch lacks names it and the alternative", "[runtime]") {
  loom::launch_env env;
  env.backend = loom::backend_kind::nccl;
  CHECK_THROWS_WITH(loom::runtime(env),
                    ContainsSubstring("LOOM_BACKEND=nccl") && ContainsSubstring("use LOOM_BACKEND=gloo"));
  env.backend.reset();
  env.device = loom::device_request{.cuda = true};
  CHECK_THROWS_WITH(loom::runtime(env),
                    ContainsSubstring("LOOM_DEVICE=cuda") && ContainsSubstring("use LOOM_DEVICE=cpu"));
}
#endif

TEST_CASE("NCCL with CPU tensors is refused, naming both variables", "[runtime]") {
  loom::launch_env env;
  env.backend = loom::backend_kind::nccl;
  env.device = loom::device_request{};
  CHECK_THROWS_WITH(loom::runtime(env),
                    ContainsSubstring("LOOM_BACKEND=nccl reduces CUDA tensors, but LOOM_DEVICE=cpu"));
}

TEST_CASE("one launched rank that names its backend gets a real process group", "[runtime]") {
  loom::launch_env env;
  env.master_addr = "127.0.0.1";
  env.master_port = unused_port();
  env.timeout = std::chrono::seconds(20);
  env.backend = loom::backend_kind::gloo;
  const loom::runtime rt(env);
  CHECK(rt.world_size() == 1);
  CHECK(rt.is_distributed());
  REQUIRE(rt.process_group());
  auto tensor = at::arange(6, at::kFloat);
  rt.comm().all_reduce(tensor, loom::reduce_op::mean).wait();
  CHECK(tensor.equal(at::arange(6, at::kFloat)));
  at::Tensor shard = at::empty({6});
  rt.comm().reduce_scatter(at::arange(6, at::kFloat), shard).wait();
  CHECK(shard.equal(at::arange(6, at::kFloat)));

  env.backend.reset();  // without LOOM_BACKEND one rank stays a single process, as before
  CHECK_FALSE(loom::runtime(env).is_distributed());
}

TEST_CASE("one process: a step's own error passes unchanged, a job failure carries loom's prefix", "[runtime]") {
  const auto rt = loom::runtime::single_process();
  CHECK_FALSE(rt.failures().failed());
  try {
    throw std::out_of_range("the user's own error");
  } catch (...) {
    CHECK_THROWS_AS(loom::rethrow_as_job_failure(rt, std::current_exception(), "forward pass"), std::out_of_range);
  }
  CHECK(rt.failures().failed());  // the step's error ended this rank's job
  CHECK_THROWS_MATCHES(rt.failures().fail("ddp(): no gradient"), loom::job_failure,
                       Catch::Matchers::Message("loom: ddp(): no gradient"));
  CHECK(rt.failures().failed());
  CHECK(rt.silent_ranks(std::chrono::milliseconds(1)).empty());
  CHECK_FALSE(rt.failures().published().has_value());
  // Each runtime has its own: what one heard of a failure is not another's.
  rt.failures().remember("rank 1 failed: out of memory");
  CHECK(rt.failures().remembered() == "rank 1 failed: out of memory");
  CHECK_FALSE(loom::runtime::single_process().failures().remembered().has_value());
}

TEST_CASE("c10's errors carry a C++ backtrace only when TORCH_SHOW_CPP_STACKTRACES=1 asks for one", "[runtime]") {
  const auto what = [] {
    try {
      (void)at::ones({2}).view({3});  // a shape c10 refuses
    } catch (const c10::Error& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  loom::launch_env asked;
  asked.show_cpp_stack_traces = true;
  { const loom::runtime rt(asked); }
  CHECK_THAT(what(), ContainsSubstring("frame #"));
  { const loom::runtime rt(loom::launch_env{}); }
  CHECK_THAT(what(), !ContainsSubstring("frame #"));
  CHECK_THAT(what(), ContainsSubstring("is invalid for input of size 2"));
}

TEST_CASE("a transport's error is quoted without Gloo's source location and generic advice", "[runtime]") {
  const ::gloo::IoException broken(
      "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
      "[127.0.0.1]:9966. This is typically caused by a remote worker crashing. Check the logs of the remote worker "
      "before reporting an error. GLHF!");
  CHECK(loom::error_text(broken) == "Connection closed by peer [127.0.0.1]:9966.");
  // Other errors are quoted whole, brackets and all.
  const std::runtime_error own("[step 3] loss is nan. This is typically caused by a learning rate too high");
  CHECK(loom::error_text(own) == own.what());
}

TEST_CASE("two schedules' difference is named by collective and tensor, for a refused resume", "[schedule]") {
  loom::collective_schedule saved;
  saved.add({loom::collective_op::all_gather, loom::step_phase::forward, {{"w", {64}, at::kFloat}}, "shard.0"});
  saved.add({loom::collective_op::reduce_scatter,
             loom::step_phase::backward,
             {{"w", {64}, at::kFloat}, {"b", {8}, at::kFloat}},
             "shard.0"});
  loom::collective_schedule wider = saved;
  loom::collective_schedule now;
  now.add(saved.entries()[0]);
  now.add({loom::collective_op::reduce_scatter,
           loom::step_phase::backward,
           {{"w", {128}, at::kFloat}, {"b", {8}, at::kFloat}},
           "shard.0"});
  CHECK(loom::schedule_difference(saved.entry_lines(), now.entry_lines()) ==
        "the step's collective 2 (reduce_scatter backward over shard.0) carried 'w Float[64]' in the saved run, "
        "'w Float[128]' in this job");
  wider.add({loom::collective_op::all_reduce, loom::step_phase::backward, {{"a", {4}, at::kFloat}}, "world"});
  CHECK(loom::schedule_difference(saved.entry_lines(), wider.entry_lines()) ==
        "a step had 2 collectives in the saved run, 3 collectives in this job");
  loom::collective_schedule other_group;
  other_group.add({loom::collective_op::all_gather, loom::step_phase::forward, {{"w", {64}, at::kFloat}}, "world"});
  CHECK(loom::schedule_difference(saved.entry_lines(), other_group.entry_lines()) ==
        "the step's collective 1 was all_gather forward over shard.0 in the saved run, all_gather forward over world "
        "in this job");
  CHECK(saved.fingerprint() != now.fingerprint());
}

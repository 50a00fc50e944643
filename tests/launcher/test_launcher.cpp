// Black-box tests of loom-run: each test starts the built launcher ($LOOM_RUN) on the helper
// program ($RANK_BEHAVIOUR), with every run bounded in time.
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

extern char** environ;

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

std::string required_env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0')
    throw std::runtime_error{std::string{name} + " must name the built program (meson test sets it)"};
  return value;
}

const std::string& loom_run() {
  static const std::string path = required_env("LOOM_RUN");
  return path;
}

const std::string& rank_behaviour() {
  static const std::string path = required_env("RANK_BEHAVIOUR");
  return path;
}

class temp_dir {
 public:
  temp_dir() {
    std::string pattern = (fs::temp_directory_path() / "loom-launcher-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error{"mkdtemp failed"};
    path_ = pattern;
  }
  ~temp_dir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;

  [[nodiscard]] const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::string read_file(const fs::path& file) {
  std::ifstream in{file};
  return {std::istreambuf_iterator<char>{in}, std::istreambuf_iterator<char>{}};
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream stream{text};
  for (std::string line; std::getline(stream, line);) lines.push_back(line);
  return lines;
}

bool contains(const std::vector<std::string>& lines, const std::string& line) {
  return std::ranges::find(lines, line) != lines.end();
}

struct finished_run {
  std::optional<int> exit_code;  // unset when loom-run itself died by a signal
  std::string out;
  std::string err;
  steady::duration took;

  [[nodiscard]] std::string last_err_line() const {
    const auto lines = lines_of(err);
    return lines.empty() ? "" : lines.back();
  }
};

// Environment changes for loom-run: a value sets the variable, std::nullopt removes it.
using env_changes = std::map<std::string, std::optional<std::string>>;

// One loom-run process, its stdout and stderr going to files. Killed if a test leaves early.
class launcher_run {
 public:
  explicit launcher_run(const std::vector<std::string>& args, const env_changes& changes = {})
      : started_{steady::now()} {
    std::vector<std::string> argv{loom_run()};
    argv.insert(argv.end(), args.begin(), args.end());
    const std::vector<std::string> environment = environment_with(changes);
    std::vector<char*> argv_pointers = pointers(argv);
    std::vector<char*> env_pointers = pointers(environment);
    const std::string out = (output_.path() / "out").string();
    const std::string err = (output_.path() / "err").string();

    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error{"fork failed"};
    if (pid_ == 0) {
      // Descriptors, not stdio: the child must not flush the test's buffered output.
      if (!redirect(STDOUT_FILENO, out) || !redirect(STDERR_FILENO, err)) std::_Exit(120);
      ::execve(argv_pointers[0], argv_pointers.data(), env_pointers.data());
      std::_Exit(121);
    }
  }
  ~launcher_run() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  launcher_run(const launcher_run&) = delete;
  launcher_run& operator=(const launcher_run&) = delete;

  void send(int signal_number) const { ::kill(pid_, signal_number); }

  // Waits at most `limit`; a launcher still running then is a failed test, not a hang.
  finished_run wait(steady::duration limit = 20s) {
    int status = 0;
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (steady::now() - started_ > limit) FAIL("loom-run did not finish in time");
      std::this_thread::sleep_for(5ms);
    }
    pid_ = -1;
    finished_run run{std::nullopt, read_file(output_.path() / "out"), read_file(output_.path() / "err"),
                     steady::now() - started_};
    if (WIFEXITED(status)) run.exit_code = WEXITSTATUS(status);
    return run;
  }

 private:
  static std::vector<std::string> environment_with(const env_changes& changes) {
    std::vector<std::string> environment;
    for (char** entry = environ; *entry != nullptr; ++entry) {
      const std::string text = *entry;
      if (!changes.contains(text.substr(0, text.find('=')))) environment.push_back(text);
    }
    for (const auto& [name, value] : changes)
      if (value) environment.push_back(name + "=" + *value);
    return environment;
  }

  static bool redirect(int target, const std::string& file) {
    const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    return fd >= 0 && ::dup2(fd, target) == target;
  }

  static std::vector<char*> pointers(const std::vector<std::string>& strings) {
    std::vector<char*> result;
    for (const std::string& s : strings) result.push_back(const_cast<char*>(s.c_str()));
    result.push_back(nullptr);
    return result;
  }

  temp_dir output_;
  steady::time_point started_;
  pid_t pid_ = -1;
};

finished_run run_launcher(const std::vector<std::string>& args, const env_changes& changes = {}) {
  return launcher_run{args, changes}.wait();
}

std::vector<std::string> with_helper(std::vector<std::string> launcher_args,
                                     const std::vector<std::string>& helper_args) {
  launcher_args.push_back("--");
  launcher_args.push_back(rank_behaviour());
  launcher_args.insert(launcher_args.end(), helper_args.begin(), helper_args.end());
  return launcher_args;
}

// Dead: no such process, or a zombie that nobody reaps (a container's init may not).
bool process_gone(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const auto after_name = stat.rfind(')');
  return after_name != std::string::npos && stat.size() > after_name + 2 && stat[after_name + 2] == 'Z';
}

// SIGKILL acts asynchronously on processes the launcher does not wait for, so allow a moment.
bool becomes_gone(pid_t pid) {
  const auto deadline = steady::now() + 3s;
  while (!process_gone(pid)) {
    if (steady::now() > deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

std::vector<pid_t> wait_for_pids(const fs::path& dir, const std::vector<std::string>& names) {
  const auto deadline = steady::now() + 10s;
  std::vector<pid_t> pids;
  for (const std::string& name : names) {
    const fs::path file = dir / name;
    while (!fs::exists(file)) {
      if (steady::now() > deadline) FAIL("no pid file " << file);
      std::this_thread::sleep_for(5ms);
    }
    pids.push_back(std::stoi(read_file(file)));
  }
  return pids;
}

int usable_cores() {
  cpu_set_t mask;
  REQUIRE(::sched_getaffinity(0, sizeof mask, &mask) == 0);
  return CPU_COUNT(&mask);
}

}  // namespace

TEST_CASE("a rank that exits with code 3 stops the others well within the grace period", "[launcher]") {
  const auto run = run_launcher(with_helper({"--nproc-per-node", "3", "--grace-s", "20"},
                                            {"--fail-rank", "1", "--exit-code", "3", "--others", "sleep"}));
  CHECK(run.exit_code == 1);
  CHECK(run.took < 5s);
  CHECK(run.last_err_line() == "loom-run: rank 1 failed first: exited with code 3");
}

TEST_CASE("the last line names the rank a hang check found at fault, not the rank that found it", "[launcher]") {
  const auto run = run_launcher(with_helper({"--nproc-per-node", "3", "--grace-s", "20"},
                                            {"--fail-rank", "0", "--blame", "2", "--others", "sleep"}));
  CHECK(run.exit_code == 1);
  CHECK(run.last_err_line() ==
        "loom-run: rank 2 failed first, as rank 0's hang check found: rank 2 has sent no heartbeat; rank 0 then "
        "exited with code 1");
  // Without a finding, the rank that failed first is the one that exited first.
  const auto plain = run_launcher(with_helper({"--nproc-per-node", "2"}, {"--fail-rank", "0", "--others", "sleep"}));
  CHECK(plain.last_err_line() == "loom-run: rank 0 failed first: exited with code 1");
}

TEST_CASE("c10d's warnings that ranks print while being stopped are left out and counted, unless --all-output",
          "[launcher]") {
  // Every rank's SIGTERM handler is in place before rank 1 fails (--wait-for-all).
  const temp_dir pids;
  const std::vector<std::string> helper{
      "--pid-dir", pids.path().string(),       "--wait-for-all", "--fail-rank", "1", "--exit-code", "3", "--others",
      "sleep",     "--c10d-warning-on-sigterm"};
  SECTION("left out: the ranks' own lines stay, and the failure is the last line") {
    const auto run = run_launcher(with_helper({"--nproc-per-node", "3", "--grace-s", "20"}, helper));
    CHECK(run.exit_code == 1);
    CHECK(run.err.find("[c10d]") == std::string::npos);
    CHECK(run.err.find("Exception raised from") == std::string::npos);
    const auto err = lines_of(run.err);
    CHECK(contains(err, "[rank 0] rank-0 stopping"));
    CHECK(contains(err, "[rank 2] rank-2 stopping"));
    CHECK(contains(err,
                   "loom-run: left out 6 lines of c10d's warnings that ranks printed while being stopped (their "
                   "connections to the stopped job broke); --all-output keeps them"));
    CHECK(run.last_err_line() == "loom-run: rank 1 failed first: exited with code 3");
  }
  SECTION("--all-output relays them") {
    const auto run = run_launcher(with_helper({"--nproc-per-node", "2", "--grace-s", "20", "--all-output"}, helper));
    CHECK(run.exit_code == 1);
    const auto err = lines_of(run.err);
    CHECK(contains(err,
                   "[rank 0] Exception raised from sendBytes at torch/csrc/distributed/c10d/Utils.hpp:758 (most "
                   "recent call first):"));
    CHECK(contains(err, "[rank 0] rank-0 stopping"));
    CHECK(run.err.find("left out") == std::string::npos);
  }
}

TEST_CASE("a rank killed by SIGKILL is named with its signal", "[launcher]") {
  const auto run = run_launcher(
      with_helper({"--nproc-per-node", "2", "--grace-s", "20"}, {"--kill-rank", "0", "--others", "sleep"}));
  CHECK(run.exit_code == 1);
  CHECK(run.took < 5s);
  CHECK(run.last_err_line() == "loom-run: rank 0 failed first: killed by signal 9 (SIGKILL)");
}

TEST_CASE("SIGTERM or SIGINT to loom-run reaches every rank and leaves no process behind", "[launcher]") {
  const auto [signal_number, name] = GENERATE(std::pair{SIGTERM, "SIGTERM"}, std::pair{SIGINT, "SIGINT"});
  CAPTURE(name);
  const temp_dir pids;
  launcher_run launcher{with_helper({"--nproc-per-node", "3", "--grace-s", "20"},
                                    {"--pid-dir", pids.path().string(), "--spawn-child", "--others", "sleep"})};
  const auto rank_pids = wait_for_pids(pids.path(), {"rank-0.pid", "rank-1.pid", "rank-2.pid"});
  const auto child_pids = wait_for_pids(pids.path(), {"rank-0-child.pid", "rank-1-child.pid", "rank-2-child.pid"});
  launcher.send(signal_number);
  const auto run = launcher.wait();

  CHECK(run.exit_code == 128 + signal_number);
  CHECK(run.took < 10s);
  CHECK(run.last_err_line() == std::string{"loom-run: stopped by "} + name + ", which every rank received");
  for (const pid_t pid : rank_pids) CHECK(process_gone(pid));
  for (const pid_t pid : child_pids) CHECK(becomes_gone(pid));
}

TEST_CASE("SIGUSR1 or SIGTERM to loom-run: ranks that stop to be resumed make it exit 75, saying so", "[launcher]") {
  const auto [signal_number, name] = GENERATE(std::pair{SIGUSR1, "SIGUSR1"}, std::pair{SIGTERM, "SIGTERM"});
  CAPTURE(name);
  const temp_dir pids;
  launcher_run launcher{with_helper({"--nproc-per-node", "3", "--grace-s", "20"},
                                    {"--pid-dir", pids.path().string(), "--preemptible", "--others", "sleep"})};
  (void)wait_for_pids(pids.path(), {"rank-0.pid", "rank-1.pid", "rank-2.pid"});
  launcher.send(signal_number);
  const auto run = launcher.wait();
  CHECK(run.exit_code == 75);
  CHECK(run.took < 10s);
  CHECK(run.last_err_line() ==
        "loom-run: 3 of 3 ranks stopped to be resumed (exit code 75): run the same command "
        "again to continue from their checkpoint");
}

TEST_CASE("a rank that ignores SIGTERM is killed once --grace-s has passed", "[launcher]") {
  const temp_dir pids;
  const auto run = run_launcher(with_helper({"--nproc-per-node", "2", "--grace-s", "1"},
                                            {"--pid-dir", pids.path().string(), "--ignore-sigterm", "--wait-for-all",
                                             "--fail-rank", "0", "--exit-code", "3", "--others", "sleep"}));
  CHECK(run.exit_code == 1);
  CHECK(run.took >= 1s);
  CHECK(run.took < 6s);
  CHECK(run.err.find("rank 1 still runs after the grace period; sending SIGKILL") != std::string::npos);
  CHECK(run.last_err_line() == "loom-run: rank 0 failed first: exited with code 3");
  CHECK(process_gone(wait_for_pids(pids.path(), {"rank-1.pid"}).front()));
}

TEST_CASE("a second Ctrl-C kills the ranks at once, saying so, not that the grace period passed", "[launcher]") {
  const temp_dir pids;
  launcher_run launcher{with_helper({"--nproc-per-node", "2", "--grace-s", "20"},
                                    {"--pid-dir", pids.path().string(), "--ignore-sigint", "--others", "sleep"})};
  const auto rank_pids = wait_for_pids(pids.path(), {"rank-0.pid", "rank-1.pid"});
  launcher.send(SIGINT);
  std::this_thread::sleep_for(200ms);  // the first one forwarded, and ignored by the ranks
  launcher.send(SIGINT);
  const auto run = launcher.wait();

  CHECK(run.exit_code == 128 + SIGINT);
  CHECK(run.took < 10s);
  const auto lines = lines_of(run.err);
  CHECK(contains(lines, "loom-run: received SIGINT; forwarding it to every rank (SIGKILL after 20 s)"));
  CHECK(contains(lines,
                 "loom-run: received SIGINT while stopping the ranks: killing every rank still running now "
                 "(SIGKILL)"));
  CHECK(run.err.find("grace period") == std::string::npos);
  CHECK(run.last_err_line() == "loom-run: stopped by SIGINT, which every rank received");
  for (const pid_t pid : rank_pids) CHECK(process_gone(pid));
}

TEST_CASE("what a rank started does not outlive loom-run", "[launcher]") {
  const temp_dir pids;
  // The child sleeps 30 s holding the rank's stdout open; loom-run must not wait for it.
  const auto run =
      run_launcher(with_helper({"--nproc-per-node", "2"}, {"--pid-dir", pids.path().string(), "--spawn-child"}));
  CHECK(run.exit_code == 0);
  CHECK(run.took < 5s);
  for (const pid_t pid : wait_for_pids(pids.path(), {"rank-0-child.pid", "rank-1-child.pid"})) CHECK(becomes_gone(pid));
}

TEST_CASE("ranks that all exit 0 make loom-run exit 0 without a failure line", "[launcher]") {
  const auto run = run_launcher(with_helper({"--nproc-per-node", "2"}, {}));
  CHECK(run.exit_code == 0);
  CHECK(run.err.empty());
}

TEST_CASE("output lines carry a [rank k] prefix unless --no-prefix", "[launcher]") {
  const std::vector<std::string> helper{"--print", "hello", "--partial", "no newline"};
  SECTION("prefixed, stdout and stderr kept apart, a partial last line completed") {
    const auto run = run_launcher(with_helper({"--nproc-per-node", "2"}, helper));
    REQUIRE(run.exit_code == 0);
    const auto out = lines_of(run.out);
    const auto err = lines_of(run.err);
    for (const std::string rank : {"0", "1"}) {
      CHECK(contains(out, "[rank " + rank + "] hello"));
      CHECK(contains(out, "[rank " + rank + "] no newline"));
      CHECK(contains(err, "[rank " + rank + "] hello (stderr)"));
    }
    CHECK(out.size() == 4);
  }
  SECTION("--no-prefix passes lines through as they are") {
    const auto run = run_launcher(with_helper({"--nproc-per-node", "2", "--no-prefix"}, helper));
    REQUIRE(run.exit_code == 0);
    CHECK(lines_of(run.out) == std::vector<std::string>{"hello", "hello", "no newline", "no newline"});
    CHECK(run.out.find("[rank") == std::string::npos);
  }
}

namespace {

// The NAME=VALUE lines rank `rank` printed (--print-env).
std::map<std::string, std::string> variables_of_rank(const finished_run& run, int rank) {
  std::map<std::string, std::string> variables;
  const std::string prefix = "[rank " + std::to_string(rank) + "] ";
  for (const std::string& line : lines_of(run.out))
    if (line.starts_with(prefix)) {
      const std::string entry = line.substr(prefix.size());
      variables[entry.substr(0, entry.find('='))] = entry.substr(entry.find('=') + 1);
    }
  return variables;
}

}  // namespace

TEST_CASE("every rank gets torchrun's variables", "[launcher]") {
  const std::vector<std::string> printed{
      "--print-env",
      "RANK,LOCAL_RANK,WORLD_SIZE,LOCAL_WORLD_SIZE,GROUP_RANK,GROUP_WORLD_SIZE,ROLE_RANK,MASTER_ADDR,"
      "MASTER_PORT,OMP_NUM_THREADS,TORCHELASTIC_USE_AGENT_STORE"};
  SECTION("one node: 127.0.0.1, one free port for all, OMP_NUM_THREADS from the cores") {
    const auto run = run_launcher(with_helper({"--nproc-per-node", "2"}, printed),
                                  {{"OMP_NUM_THREADS", std::nullopt}, {"TORCHELASTIC_USE_AGENT_STORE", "True"}});
    REQUIRE(run.exit_code == 0);
    const auto rank0 = variables_of_rank(run, 0);
    const auto rank1 = variables_of_rank(run, 1);
    for (const auto& [rank, variables] : {std::pair{0, rank0}, std::pair{1, rank1}}) {
      CAPTURE(rank);
      CHECK(variables.at("RANK") == std::to_string(rank));
      CHECK(variables.at("LOCAL_RANK") == std::to_string(rank));
      CHECK(variables.at("ROLE_RANK") == std::to_string(rank));
      CHECK(variables.at("WORLD_SIZE") == "2");
      CHECK(variables.at("LOCAL_WORLD_SIZE") == "2");
      CHECK(variables.at("GROUP_RANK") == "0");
      CHECK(variables.at("GROUP_WORLD_SIZE") == "1");
      CHECK(variables.at("MASTER_ADDR") == "127.0.0.1");
      CHECK(variables.at("OMP_NUM_THREADS") == std::to_string(std::max(1, usable_cores() / 2)));
      CHECK(variables.at("TORCHELASTIC_USE_AGENT_STORE") == "False");
    }
    const int port = std::stoi(rank0.at("MASTER_PORT"));
    CHECK(port > 0);
    CHECK(port < 65536);
    CHECK(rank1.at("MASTER_PORT") == rank0.at("MASTER_PORT"));
  }
  SECTION("a user's OMP_NUM_THREADS and master are kept; torchrun's underscore spellings work") {
    const auto run =
        run_launcher(with_helper({"--nproc_per_node=2", "--master_addr", "localhost", "--master_port=29555"}, printed),
                     {{"OMP_NUM_THREADS", "7"}});
    REQUIRE(run.exit_code == 0);
    for (const int rank : {0, 1}) {
      const auto variables = variables_of_rank(run, rank);
      CHECK(variables.at("OMP_NUM_THREADS") == "7");
      CHECK(variables.at("MASTER_ADDR") == "localhost");
      CHECK(variables.at("MASTER_PORT") == "29555");
    }
  }
  SECTION("GLIBC_TUNABLES gains loom's malloc tuning; a user's own tunables are kept and win") {
    const std::vector<std::string> tunables{"--print-env", "GLIBC_TUNABLES"};
    const auto tuned =
        run_launcher(with_helper({"--nproc-per-node", "2"}, tunables), {{"GLIBC_TUNABLES", std::nullopt}});
    REQUIRE(tuned.exit_code == 0);
    for (const int rank : {0, 1}) {
      CHECK(variables_of_rank(tuned, rank).at("GLIBC_TUNABLES") ==
            "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824");
    }
    const auto merged = run_launcher(with_helper({"--nproc-per-node", "1"}, tunables),
                                     {{"GLIBC_TUNABLES", "glibc.cpu.hwcaps=-AVX512F:glibc.malloc.trim_threshold=7"}});
    REQUIRE(merged.exit_code == 0);
    CHECK(variables_of_rank(merged, 0).at("GLIBC_TUNABLES") ==
          "glibc.cpu.hwcaps=-AVX512F:glibc.malloc.trim_threshold=7:glibc.malloc.mmap_threshold=33554432");
    const auto untouched = run_launcher(with_helper({"--use-default-allocator"}, tunables),
                                        {{"GLIBC_TUNABLES", "glibc.malloc.trim_threshold=7"}});
    REQUIRE(untouched.exit_code == 0);
    CHECK(variables_of_rank(untouched, 0).at("GLIBC_TUNABLES") == "glibc.malloc.trim_threshold=7");
  }
  SECTION("node 1 of 2 runs global ranks 2 and 3") {
    const auto run = run_launcher(with_helper(
        {"--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2", "--master-addr", "10.0.0.1"}, printed));
    REQUIRE(run.exit_code == 0);
    for (const int local_rank : {0, 1}) {
      const auto variables = variables_of_rank(run, 2 + local_rank);
      CHECK(variables.at("RANK") == std::to_string(2 + local_rank));
      CHECK(variables.at("LOCAL_RANK") == std::to_string(local_rank));
      CHECK(variables.at("WORLD_SIZE") == "4");
      CHECK(variables.at("GROUP_RANK") == "1");
      CHECK(variables.at("GROUP_WORLD_SIZE") == "2");
      CHECK(variables.at("MASTER_ADDR") == "10.0.0.1");
      CHECK(variables.at("MASTER_PORT") == "29500");  // torchrun's default with several nodes
    }
  }
}

TEST_CASE("the master from the environment, as torchrun reads it: PET_MASTER_*, never MASTER_*, each said in a line",
          "[launcher]") {
  const std::vector<std::string> printed{"--print-env", "MASTER_ADDR,MASTER_PORT"};
  const env_changes clean{{"PET_MASTER_ADDR", std::nullopt},
                          {"PET_MASTER_PORT", std::nullopt},
                          {"MASTER_ADDR", std::nullopt},
                          {"MASTER_PORT", std::nullopt}};
  const auto with = [&](env_changes changes) {
    for (const auto& [name, value] : clean) changes.try_emplace(name, value);
    return changes;
  };
  SECTION("PET_MASTER_ADDR and PET_MASTER_PORT stand for the flags") {
    const auto run = run_launcher(with_helper({"--nproc-per-node", "2"}, printed),
                                  with({{"PET_MASTER_ADDR", "localhost"}, {"PET_MASTER_PORT", "29556"}}));
    REQUIRE(run.exit_code == 0);
    for (const int rank : {0, 1}) {
      CHECK(variables_of_rank(run, rank).at("MASTER_ADDR") == "localhost");
      CHECK(variables_of_rank(run, rank).at("MASTER_PORT") == "29556");
    }
    CHECK(lines_of(run.err) ==
          std::vector<std::string>{
              "loom-run: PET_MASTER_ADDR=localhost in the environment stands for --master-addr localhost, as under "
              "torchrun",
              "loom-run: PET_MASTER_PORT=29556 in the environment stands for --master-port 29556, as under torchrun"});
  }
  SECTION("a flag wins over PET_MASTER_PORT, without a word") {
    const auto run =
        run_launcher(with_helper({"--master-port", "29557"}, printed), with({{"PET_MASTER_PORT", "29556"}}));
    REQUIRE(run.exit_code == 0);
    CHECK(variables_of_rank(run, 0).at("MASTER_PORT") == "29557");
    CHECK(run.err.empty());
  }
  SECTION("MASTER_ADDR and MASTER_PORT are replaced, as torchrun replaces them, naming the flag that would use them") {
    const auto run = run_launcher(with_helper({"--nproc-per-node", "2"}, printed),
                                  with({{"MASTER_ADDR", "10.9.9.9"}, {"MASTER_PORT", "29558"}}));
    REQUIRE(run.exit_code == 0);
    CHECK(variables_of_rank(run, 0).at("MASTER_ADDR") == "127.0.0.1");
    CHECK(variables_of_rank(run, 1).at("MASTER_PORT") == variables_of_rank(run, 0).at("MASTER_PORT"));
    CHECK(lines_of(run.err) ==
          std::vector<std::string>{"loom-run: MASTER_ADDR=10.9.9.9 in the environment is not used, as under torchrun: "
                                   "the ranks meet at 127.0.0.1; give --master-addr 10.9.9.9 to meet there",
                                   "loom-run: MASTER_PORT=29558 in the environment is not used, as under torchrun: "
                                   "the ranks meet at a free port that loom-run picks; give --master-port 29558 to "
                                   "meet there"});
    // Given by the flags, the same values are used, and nothing is said.
    const auto flagged = run_launcher(with_helper({"--master-addr", "10.9.9.9", "--master-port", "29558"}, printed),
                                      with({{"MASTER_ADDR", "10.9.9.9"}, {"MASTER_PORT", "29558"}}));
    REQUIRE(flagged.exit_code == 0);
    CHECK(variables_of_rank(flagged, 0).at("MASTER_PORT") == "29558");
    CHECK(flagged.err.empty());
  }
  SECTION("several nodes: MASTER_PORT left for 29500, MASTER_ADDR not taken for --master-addr") {
    const auto run =
        run_launcher(with_helper({"--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1"}, printed),
                     with({{"MASTER_PORT", "1234"}}));
    REQUIRE(run.exit_code == 0);
    CHECK(variables_of_rank(run, 1).at("MASTER_PORT") == "29500");
    CHECK(run.err.find("loom-run: MASTER_PORT=1234 in the environment is not used, as under torchrun: the ranks meet "
                       "at port 29500, torchrun's default for several nodes; give --master-port 1234 to meet there") !=
          std::string::npos);
    const auto no_address = run_launcher(with_helper({"--nnodes", "2"}, printed), with({{"MASTER_ADDR", "10.0.0.1"}}));
    CHECK(no_address.exit_code == 2);
    CHECK(lines_of(no_address.err).front() ==
          "loom-run: --nnodes 2 expects --master-addr HOST (node 0's address, reachable from every node); "
          "MASTER_ADDR=10.0.0.1 in the environment is not read, as under torchrun: give --master-addr 10.0.0.1");
  }
  SECTION("a PET_ value is checked as its flag's") {
    const auto run = run_launcher(with_helper({}, printed), with({{"PET_MASTER_PORT", "70000"}}));
    CHECK(run.exit_code == 2);
    CHECK(lines_of(run.err).front() == "loom-run: PET_MASTER_PORT expects a port number in 1..65535, got '70000'");
  }
}

TEST_CASE("--enable-tcmalloc and --enable-jemalloc preload the allocator found, ahead of a user's own preloads",
          "[launcher]") {
  const std::string folder = required_env("STAND_IN_ALLOCATORS");
  const std::vector<std::string> printed{"--print-env", "LD_PRELOAD,MALLOC_CONF,GLIBC_TUNABLES"};
  SECTION("tcmalloc, found through LD_LIBRARY_PATH, for every rank; glibc's tunables left alone") {
    const auto run = run_launcher(with_helper({"--nproc-per-node", "2", "--enable-tcmalloc"}, printed),
                                  {{"LD_LIBRARY_PATH", "/nonexistent:" + folder},
                                   {"LD_PRELOAD", std::nullopt},
                                   {"GLIBC_TUNABLES", std::nullopt}});
    REQUIRE(run.exit_code == 0);
    for (const int rank : {0, 1}) {
      const auto variables = variables_of_rank(run, rank);
      CHECK(variables.at("LD_PRELOAD") == folder + "/libtcmalloc_minimal.so.4");
      CHECK(variables.at("GLIBC_TUNABLES") == "<unset>");
      CHECK(variables.at("MALLOC_CONF") == "<unset>");
    }
  }
  SECTION("jemalloc first, a user's preload after it, run_cpu's MALLOC_CONF unless the user set one") {
    const std::string users = folder + "/libtcmalloc_minimal.so.4";
    const auto run = run_launcher(with_helper({"--enable_jemalloc"}, printed),
                                  {{"LD_LIBRARY_PATH", folder}, {"LD_PRELOAD", users}, {"MALLOC_CONF", std::nullopt}});
    REQUIRE(run.exit_code == 0);
    CHECK(variables_of_rank(run, 0).at("LD_PRELOAD") == folder + "/libjemalloc.so.2:" + users);
    CHECK(variables_of_rank(run, 0).at("MALLOC_CONF") ==
          "oversize_threshold:1,background_thread:true,metadata_thp:auto");
    const auto own = run_launcher(with_helper({"--enable-jemalloc"}, printed),
                                  {{"LD_LIBRARY_PATH", folder}, {"MALLOC_CONF", "narenas:2"}});
    REQUIRE(own.exit_code == 0);
    CHECK(variables_of_rank(own, 0).at("MALLOC_CONF") == "narenas:2");
  }
  SECTION("an allocator that is nowhere is refused before any rank starts, naming it and its package") {
    bool on_the_system = false;
    for (const char* system :
         {"/usr/local/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib"})
      on_the_system = on_the_system || fs::exists(fs::path{system} / "libjemalloc.so.2");
    if (on_the_system) SKIP("this machine has jemalloc in a system folder");
    const auto run = run_launcher(with_helper({"--enable-jemalloc"}, printed), {{"LD_LIBRARY_PATH", std::nullopt}});
    CHECK(run.exit_code == 2);
    CHECK(run.err.find("loom-run: --enable-jemalloc found no libjemalloc.so.2 in LD_LIBRARY_PATH or the system's "
                       "library folders (/usr/local/lib") != std::string::npos);
    CHECK(run.err.find("apt install libjemalloc2") != std::string::npos);
    CHECK(run.err.find("[rank") == std::string::npos);
  }
}

TEST_CASE("bad flags are rejected naming the flag and its accepted form", "[launcher]") {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases{
      {{"--nproc-per-node", "abc", "true"}, "--nproc-per-node expects a positive integer"},
      {{"--nproc-per-node", "0", "true"}, "--nproc-per-node expects a positive integer"},
      {{"--nnodes", "1:2", "true"}, "--nnodes expects a positive integer"},
      {{"--master-port", "70000", "true"}, "--master-port expects a port number in 1..65535, got '70000'"},
      {{"--grace-s", "-1", "true"}, "--grace-s expects a number of seconds in 0..86400"},
      {{"--nproc-per-node"}, "--nproc-per-node: 1 required N missing"},
      {{"--frobnicate", "true"}, "unknown flag '--frobnicate'"},
      {{"--no-prefix=yes", "true"}, "no-prefix was given a disallowed flag override"},
      {{"--nproc-per-node", "2"}, "no program given"},
      {{"--nnodes", "2", "--node-rank", "2", "--master-addr", "h", "true"}, "--node-rank expects an integer R"},
      {{"--nnodes", "2", "true"}, "--nnodes 2 expects --master-addr HOST"},
      {{"--nproc_per_node=0", "true"}, "--nproc-per-node expects a positive integer"},
      {{"--nproc-per-node", "2", "--frobnicate=1", "true"}, "unknown flag '--frobnicate'"},
      // A '--' later on does not make an unknown flag before it the program.
      {{"--bogus", "--nproc-per-node", "1", "--", "true"}, "unknown flag '--bogus'"},
      {{"--nproc-per-node", "1", "--bogus", "--", "true"}, "unknown flag '--bogus'"},
      {{"--max-restarts", "-1", "true"},
       "--max-restarts expects a whole number N of restarts after a failure, "
       "0..1000000, got '-1'"},
      {{"--max_restarts=two", "true"}, "--max-restarts expects a whole number N of restarts after a failure"},
      {{"--max-restarts", "1.5", "true"}, "--max-restarts expects a whole number N"},
      {{"--max-restarts", "", "true"}, "--max-restarts expects a whole number N"},
      // torchrun's spellings: each answered with what to do.
      {{"--rdzv-endpoint", ":29400", "true"}, "--rdzv-endpoint expects HOST or HOST:PORT"},
      {{"--rdzv-endpoint=node0:http", "true"}, "--rdzv-endpoint expects HOST or HOST:PORT"},
      {{"--rdzv-backend", "etcd", "true"}, "--rdzv-backend expects c10d or static"},
      {{"--log-dir", "/tmp/logs", "true"}, "--log-dir is torchrun's, not loom-run's: every rank's output comes"},
      {{"--tee", "3", "true"}, "--tee is torchrun's, not loom-run's: every rank's output comes"},
      {{"--local-ranks-filter", "0", "true"}, "--local-ranks-filter is torchrun's, not loom-run's"},
      {{"train.py"}, "'train.py' is a Python script; loom-run starts an executable"},
      {{"--enable-tcmalloc", "--enable-jemalloc", "true"},
       "--enable-tcmalloc and --enable-jemalloc each choose the ranks' allocator: give one of them"},
      {{"--use-default-allocator", "--enable-tcmalloc", "true"},
       "--use-default-allocator and --enable-tcmalloc each choose the ranks' allocator"},
      {{"--nproc-per-node", "2", "--", "train.py", "--lr", "1"}, "'train.py' is a Python script"},
  };
  for (const auto& [args, message] : cases) {
    CAPTURE(args, message);
    const auto run = run_launcher(args);
    CHECK(run.exit_code == 2);
    CHECK(run.err.find("loom-run: " + message) != std::string::npos);
    CHECK(run.err.find("[rank") == std::string::npos);  // nothing started
    CHECK(run.out.empty());
  }
}

TEST_CASE("--max-restarts: a failed attempt stops every rank and starts them all again, with a fresh rendezvous",
          "[launcher]") {
  const std::vector<std::string> printed{"--print-env",
                                         "TORCHELASTIC_RESTART_COUNT,TORCHELASTIC_MAX_RESTARTS,MASTER_PORT"};
  const auto values_of = [](const finished_run& run, int rank, const std::string& variable) {
    std::vector<std::string> values;
    const std::string prefix = "[rank " + std::to_string(rank) + "] " + variable + "=";
    for (const std::string& line : lines_of(run.out))
      if (line.starts_with(prefix)) values.push_back(line.substr(prefix.size()));
    return values;
  };
  SECTION("a rank that fails once: the second attempt finishes and loom-run exits 0") {
    auto args = printed;
    args.insert(args.end(), {"--fail-rank", "1", "--exit-code", "3", "--fail-attempts", "1"});
    const auto run = run_launcher(with_helper({"--nproc-per-node", "2", "--max-restarts", "2"}, args));
    CHECK(run.exit_code == 0);
    CHECK(contains(
        lines_of(run.err),
        "loom-run: rank 1 failed (exited with code 3): restarting all 2 ranks, restart 1 of 2 (1 left after it)"));
    CHECK(run.err.find("failed first") == std::string::npos);
    // Rank 1 prints before it fails; rank 0 may be stopped before it prints in the first attempt.
    CHECK(values_of(run, 1, "TORCHELASTIC_RESTART_COUNT") == std::vector<std::string>{"0", "1"});
    CHECK(values_of(run, 1, "TORCHELASTIC_MAX_RESTARTS") == std::vector<std::string>{"2", "2"});
    CHECK(values_of(run, 0, "TORCHELASTIC_RESTART_COUNT").back() == "1");
    const auto ports = values_of(run, 1, "MASTER_PORT");
    REQUIRE(ports.size() == 2);
    CHECK(ports[0] != ports[1]);
    CHECK(values_of(run, 0, "MASTER_PORT").back() == ports[1]);
  }
  SECTION("a rank killed in every attempt: loom-run ends after the third failure, naming it") {
    const auto run = run_launcher(
        with_helper({"--nproc-per-node", "2", "--max-restarts", "2", "--grace-s", "20"},
                    {"--print-env", "TORCHELASTIC_RESTART_COUNT", "--kill-rank", "0", "--others", "sleep"}));
    CHECK(run.exit_code == 1);
    CHECK(run.took < 10s);
    const auto lines = lines_of(run.err);
    CHECK(contains(lines,
                   "loom-run: rank 0 failed (killed by signal 9 (SIGKILL)): restarting all 2 ranks, restart 1 "
                   "of 2 (1 left after it)"));
    CHECK(contains(lines,
                   "loom-run: rank 0 failed (killed by signal 9 (SIGKILL)): restarting all 2 ranks, restart 2 "
                   "of 2 (0 left after it)"));
    CHECK(
        run.last_err_line() ==
        "loom-run: rank 0 failed first: killed by signal 9 (SIGKILL) (after 2 restarts, none left: --max-restarts 2)");
    // The rank that kills itself prints first; its peer may be stopped before it prints.
    CHECK(values_of(run, 0, "TORCHELASTIC_RESTART_COUNT") == std::vector<std::string>{"0", "1", "2"});
  }
  SECTION("--max-restarts 0, the default, is one attempt") {
    const auto run = run_launcher(with_helper({"--nproc-per-node", "2", "--max-restarts", "0"},
                                              {"--fail-rank", "1", "--exit-code", "3", "--fail-attempts", "1"}));
    CHECK(run.exit_code == 1);
    CHECK(run.err.find("restarting") == std::string::npos);
    CHECK(run.last_err_line() == "loom-run: rank 1 failed first: exited with code 3");
  }
}

TEST_CASE("--max-restarts: a rank that exits 75 (to be resumed) or a signal to loom-run starts nothing again",
          "[launcher]") {
  const auto resumable = run_launcher(
      with_helper({"--nproc-per-node", "2", "--max-restarts", "2"}, {"--fail-rank", "1", "--exit-code", "75"}));
  CHECK(resumable.exit_code == 75);
  CHECK(resumable.err.find("restarting") == std::string::npos);

  const temp_dir pids;
  launcher_run launcher{with_helper({"--nproc-per-node", "2", "--max-restarts", "3"},
                                    {"--pid-dir", pids.path().string(), "--others", "sleep", "--fail-rank", "7"})};
  (void)wait_for_pids(pids.path(), {"rank-0.pid", "rank-1.pid"});
  launcher.send(SIGTERM);
  const auto stopped = launcher.wait();
  CHECK(stopped.exit_code == 128 + SIGTERM);
  CHECK(stopped.err.find("restarting") == std::string::npos);
}

TEST_CASE("a program that cannot be run fails its rank with code 127, saying why", "[launcher]") {
  const auto run = run_launcher({"--nproc-per-node", "1", "/nonexistent/program"});
  CHECK(run.exit_code == 1);
  CHECK(run.err.find("[rank 0] loom-run: cannot run '/nonexistent/program'") != std::string::npos);
  CHECK(run.last_err_line() == "loom-run: rank 0 failed first: exited with code 127");
  // After `--`, a word that starts with '-' is the program.
  const auto dashed = run_launcher({"--nproc-per-node", "1", "--", "-dashed-program"});
  CHECK(dashed.exit_code == 1);
  CHECK(dashed.err.find("[rank 0] loom-run: cannot run '-dashed-program'") != std::string::npos);
}

TEST_CASE("torchrun's rendezvous flags: the c10d endpoint is node 0's address and port", "[launcher]") {
  const auto run = run_launcher(with_helper({"--rdzv-backend", "c10d", "--rdzv-id", "job-7", "--rdzv-endpoint",
                                             "127.0.0.1:29731", "--nproc-per-node", "2", "--no-python"},
                                            {"--print-env", "MASTER_ADDR,MASTER_PORT"}));
  CHECK(run.exit_code == 0);
  CHECK(run.out.find("[rank 1] MASTER_ADDR=127.0.0.1") != std::string::npos);
  CHECK(run.out.find("[rank 1] MASTER_PORT=29731") != std::string::npos);
  const auto version = run_launcher({"--version"});
  CHECK(version.exit_code == 0);
  CHECK(version.out.starts_with("loom-run "));
}

TEST_CASE("--help lists the flags and exits 0", "[launcher]") {
  const auto run = run_launcher({"--help"});
  CHECK(run.exit_code == 0);
  for (const char* flag :
       {"--nproc-per-node", "--nnodes", "--node-rank", "--master-addr", "--master-port", "--no-prefix", "--grace-s"})
    CHECK(run.out.find(flag) != std::string::npos);
}

// A torch-free stand-in for a training program, for the launcher tests. Each rank (RANK from the
// environment) does what the arguments ask, in this order:
//   --ignore-sigterm     ignore SIGTERM, so only SIGKILL stops this rank
//   --ignore-sigint      ignore SIGINT (a program that takes its time over Ctrl-C), likewise
//   --preemptible        on SIGTERM or SIGUSR1, exit with code 75 ("resumable"), as loom::train does
//   --spawn-child        fork a child that sleeps as long as --sleep-s (pid in DIR/rank-<RANK>-child.pid)
//   --pid-dir DIR        write this process's pid to DIR/rank-<RANK>.pid
//   --wait-for-all       wait (at most 10 s) until every rank wrote its pid file, so that
//                        what follows happens with every rank set up
//   --print-env A,B,...  print "A=<value>" for each variable ("A=<unset>" when unset)
//   --print TEXT         print "TEXT" on stdout and "TEXT (stderr)" on stderr
//   --partial TEXT       print TEXT without a newline at the end
//   --fail-rank R --exit-code C   rank R exits with code C
//   --blame B            ... having written to LOOM_ERROR_FILE that its hang check found rank B at fault
//   --kill-rank R        rank R raises SIGKILL on itself
//   --fail-attempts K    ... only in the first K attempts (TORCHELASTIC_RESTART_COUNT < K); later it
//                        exits 0 (default: in every attempt)
//   --others sleep|exit  what the other ranks do then (default exit 0)
//   --sleep-s S          how long "sleep" lasts (default 30, at most 60: a test never hangs)
//   --c10d-warning-on-sigterm  while sleeping, on SIGTERM print to stderr what c10d prints when a
//                        store connection breaks (a warning record), then "rank-K stopping", and exit 1
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

struct behaviour {
  std::optional<std::filesystem::path> pid_dir;
  bool spawn_child = false;
  bool ignore_sigterm = false;
  bool ignore_sigint = false;
  bool preemptible = false;
  bool wait_for_all = false;
  std::vector<std::string> printed_variables;
  std::vector<std::string> lines;
  std::optional<std::string> partial;
  std::optional<int> fail_rank;
  std::optional<int> blame;
  int exit_code = 1;
  std::optional<int> kill_rank;
  std::optional<int> fail_attempts;
  bool others_sleep = false;
  int sleep_seconds = 30;
  bool c10d_warning_on_sigterm = false;
};

[[noreturn]] void usage(std::string_view problem) {
  std::cerr << "rank_behaviour: " << problem << '\n';
  std::exit(64);
}

std::vector<std::string> split_commas(const std::string& list) {
  std::vector<std::string> names;
  std::istringstream stream{list};
  for (std::string name; std::getline(stream, name, ',');) names.push_back(name);
  return names;
}

behaviour parse(int argc, char** argv) {
  behaviour b;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(std::string{flag} + " needs a value");
      return argv[++i];
    };
    if (flag == "--pid-dir")
      b.pid_dir = value();
    else if (flag == "--spawn-child")
      b.spawn_child = true;
    else if (flag == "--ignore-sigterm")
      b.ignore_sigterm = true;
    else if (flag == "--ignore-sigint")
      b.ignore_sigint = true;
    else if (flag == "--preemptible")
      b.preemptible = true;
    else if (flag == "--wait-for-all")
      b.wait_for_all = true;
    else if (flag == "--print-env")
      b.printed_variables = split_commas(value());
    else if (flag == "--print")
      b.lines.push_back(value());
    else if (flag == "--partial")
      b.partial = value();
    else if (flag == "--fail-rank")
      b.fail_rank = std::stoi(value());
    else if (flag == "--blame")
      b.blame = std::stoi(value());
    else if (flag == "--exit-code")
      b.exit_code = std::stoi(value());
    else if (flag == "--kill-rank")
      b.kill_rank = std::stoi(value());
    else if (flag == "--fail-attempts")
      b.fail_attempts = std::stoi(value());
    else if (flag == "--others")
      b.others_sleep = value() == "sleep";
    else if (flag == "--c10d-warning-on-sigterm")
      b.c10d_warning_on_sigterm = true;
    else if (flag == "--sleep-s")
      b.sleep_seconds = std::clamp(std::stoi(value()), 0, 60);
    else
      usage("unknown flag " + std::string{flag});
  }
  return b;
}

// Written under a temporary name, then renamed: a reader never sees a half-written pid.
void write_pid(const std::filesystem::path& file, pid_t pid) {
  const std::filesystem::path partial = file.string() + ".tmp";
  std::ofstream{partial} << pid << '\n';
  std::filesystem::rename(partial, file);
}

void wait_for_every_pid_file(const std::filesystem::path& dir) {
  const char* world_size = std::getenv("WORLD_SIZE");
  const int ranks = world_size ? std::atoi(world_size) : 1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds{10};
  for (int rank = 0; rank < ranks; ++rank)
    while (!std::filesystem::exists(dir / ("rank-" + std::to_string(rank) + ".pid")) &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds{5});
}

volatile std::sig_atomic_t preempted = 0;
extern "C" void note_preemption(int) { preempted = 1; }
volatile std::sig_atomic_t terminated = 0;
extern "C" void note_termination(int) { terminated = 1; }

// What c10d's TCPStore client logs when rank 0, which hosts the store, is gone.
void print_c10d_warning() {
  std::cerr << "[W1203 11:55:53.593908036 TCPStore.cpp:106] [c10d] sendBytes failed on SocketImpl(fd=9): Broken "
               "pipe\n"
               "Exception raised from sendBytes at torch/csrc/distributed/c10d/Utils.hpp:758 (most recent call "
               "first):\n"
               "\n";
}

}  // namespace

int main(int argc, char** argv) {
  const behaviour b = parse(argc, argv);
  const char* rank_text = std::getenv("RANK");
  const int rank = rank_text ? std::atoi(rank_text) : 0;
  const std::string name = "rank-" + std::to_string(rank);

  if (b.ignore_sigterm) ::signal(SIGTERM, SIG_IGN);
  if (b.ignore_sigint) ::signal(SIGINT, SIG_IGN);
  if (b.c10d_warning_on_sigterm) ::signal(SIGTERM, note_termination);
  if (b.preemptible) {
    ::signal(SIGTERM, note_preemption);
    ::signal(SIGUSR1, note_preemption);
  }
  if (b.spawn_child) {
    const pid_t child = ::fork();
    if (child == 0) {
      std::this_thread::sleep_for(std::chrono::seconds{b.sleep_seconds});
      std::_Exit(0);
    }
    if (b.pid_dir) write_pid(*b.pid_dir / (name + "-child.pid"), child);
  }
  if (b.pid_dir) write_pid(*b.pid_dir / (name + ".pid"), ::getpid());
  if (b.wait_for_all) {
    if (!b.pid_dir) usage("--wait-for-all needs --pid-dir");
    wait_for_every_pid_file(*b.pid_dir);
  }

  for (const std::string& variable : b.printed_variables) {
    const char* value = std::getenv(variable.c_str());
    std::cout << variable << '=' << (value ? value : "<unset>") << '\n';
  }
  for (const std::string& line : b.lines) {
    std::cout << line << '\n';
    std::cerr << line << " (stderr)\n";
  }
  if (b.partial) std::cout << *b.partial;
  std::cout.flush();

  const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
  const bool failing = !b.fail_attempts || (attempt ? std::atoi(attempt) : 0) < *b.fail_attempts;
  if (b.fail_rank == rank && failing && b.blame) {
    const char* error_file = std::getenv("LOOM_ERROR_FILE");
    if (error_file == nullptr) usage("--blame needs LOOM_ERROR_FILE, which loom-run sets");
    std::ofstream(error_file) << *b.blame << "\nrank " << *b.blame << " has sent no heartbeat\n";
  }
  if (b.fail_rank == rank) return failing ? b.exit_code : 0;
  if (b.kill_rank == rank && failing) ::raise(SIGKILL);
  if (b.others_sleep) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds{b.sleep_seconds};
    while (std::chrono::steady_clock::now() < deadline) {
      if (preempted) return 75;  // the step under way finished, the checkpoint written
      if (terminated) {
        print_c10d_warning();
        std::cerr << name << " stopping" << std::endl;
        return 1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds{5});
    }
  }
  return 0;
}

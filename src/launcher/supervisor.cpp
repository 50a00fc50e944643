#include "supervisor.hpp"

#include "error_files.hpp"
#include "fd_io.hpp"
#include "line_relay.hpp"
#include "rank_environment.hpp"
#include "rank_process.hpp"
#include "signal_pipe.hpp"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <optional>
#include <system_error>
#include <variant>
#include <vector>

namespace loom::launcher {
namespace {

using steady = std::chrono::steady_clock;

struct output_stream {
  unique_fd pipe;  // read end; reset once every writer closed it
  line_relay relay;
};

struct rank_failed {
  int rank;
  exit_status status;
};
struct launcher_signalled {
  int signal_number;
};
// Why the run is being stopped; the first cause wins and is what the last line reports.
using stop_cause = std::variant<std::monostate, rank_failed, launcher_signalled>;

void say(const std::string& line) { write_all(STDERR_FILENO, "loom-run: " + line + "\n"); }

class supervisor {
 public:
  explicit supervisor(const launch_options& options) : options_{options} {}

  // Each start of the ranks is an attempt; a failed one is followed by another while restarts
  // remain. A rendezvous of its own for each (a new free port on one node, and in every case a new
  // key space in the store, which the ranks take from TORCHELASTIC_RESTART_COUNT), so that nothing
  // of an earlier attempt can join a later one.
  int run() {
    for (int restart = 0;; ++restart) {
      run_attempt(restart);
      const auto* failed = std::get_if<rank_failed>(&cause_);
      if (failed == nullptr || restart == options_.max_restarts) return report(restart);
      say("rank " + std::to_string(failed->rank) + " failed (" + failed->status.describe() + "): restarting all " +
          std::to_string(ranks_count_) + " ranks, restart " + std::to_string(restart + 1) + " of " +
          std::to_string(options_.max_restarts) + " (" + std::to_string(options_.max_restarts - restart - 1) +
          " left after it)");
    }
  }

 private:
  void run_attempt(int restart) {
    cause_ = std::monostate{};
    errors_.clear();
    resumable_ranks_ = 0;
    kill_deadline_.reset();
    start_ranks(restart, resolve_rendezvous(options_));
    while (std::ranges::any_of(ranks_, &rank_process::running)) {
      wait_for_events();
      check_exits();
      kill_after_grace();
    }
    ranks_.clear();  // kills what the ranks left behind, which may hold their pipes open
    std::size_t left_out = 0;
    for (output_stream& output : outputs_) {
      while (read_some(output)) {
      }
      output.relay.finish();
      left_out += output.relay.left_out();
    }
    outputs_.clear();
    if (left_out > 0)
      say("left out " + std::to_string(left_out) +
          " lines of c10d's warnings that ranks printed while being "
          "stopped (their connections to the stopped job broke); --all-output keeps them");
  }

  void start_ranks(int restart, const rendezvous_point& master) {
    ranks_count_ = options_.nproc_per_node;
    const std::vector<std::string> inherited = current_environment();
    const int cores = available_cores();
    for (int local_rank = 0; local_rank < options_.nproc_per_node; ++local_rank) {
      const int rank = options_.node_rank * options_.nproc_per_node + local_rank;
      pipe_ends out = make_pipe();
      pipe_ends err = make_pipe();
      ranks_.emplace_back(
          rank_command{rank, options_.program,
                       rank_environment(inherited, options_, master, restart, local_rank, cores, errors_.path_of(rank)),
                       out.write_end.get(), err.write_end.get()},
          signals_);
      const std::string prefix = options_.prefix_output ? "[rank " + std::to_string(rank) + "] " : "";
      add_output(std::move(out.read_end), prefix, STDOUT_FILENO);
      add_output(std::move(err.read_end), prefix, STDERR_FILENO);
      // The write ends close here: end of file then means the rank and its children are done.
    }
  }

  void add_output(unique_fd read_end, const std::string& prefix, int destination) {
    set_nonblocking(read_end.get());
    outputs_.push_back({std::move(read_end), line_relay{prefix, destination}});
  }

  void wait_for_events() {
    std::vector<pollfd> polled{{signals_.fd(), POLLIN, 0}};
    std::vector<output_stream*> streams;
    for (output_stream& output : outputs_) {
      if (!output.pipe.valid()) continue;
      polled.push_back({output.pipe.get(), POLLIN, 0});
      streams.push_back(&output);
    }
    if (::poll(polled.data(), polled.size(), poll_timeout_ms()) < 0) {
      if (errno == EINTR) return;
      throw std::system_error{errno, std::generic_category(), "poll"};
    }
    if (polled[0].revents != 0)
      for (const int signal_number : signals_.take_received())
        if (signal_number != SIGCHLD) on_launcher_signal(signal_number);  // SIGCHLD only wakes us
    for (std::size_t i = 1; i < polled.size(); ++i)
      if (polled[i].revents != 0) read_some(*streams[i - 1]);
  }

  int poll_timeout_ms() const {
    if (!kill_deadline_) return -1;
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(*kill_deadline_ - steady::now());
    return static_cast<int>(std::max<std::chrono::milliseconds::rep>(0, left.count()));
  }

  // Returns whether more may be ready right away: only after a full buffer, so that draining
  // ends even if something that escaped the rank's session keeps writing.
  static bool read_some(output_stream& output) {
    if (!output.pipe.valid()) return false;
    char buffer[65536];
    const ssize_t count = ::read(output.pipe.get(), buffer, sizeof buffer);
    if (count > 0) {
      output.relay.feed({buffer, static_cast<std::size_t>(count)});
      return static_cast<std::size_t>(count) == sizeof buffer;
    }
    if (count < 0 && (errno == EAGAIN || errno == EINTR)) return false;
    output.pipe.reset();  // end of file, or an error that will not go away
    return false;
  }

  void check_exits() {
    for (rank_process& rank : ranks_) {
      if (!rank.running()) continue;
      const std::optional<exit_status>& status = rank.check_exit();
      if (status && status->resumable()) ++resumable_ranks_;
      // A rank that stopped to be resumed is not a failure: its peers stop after the same step.
      if (!status || status->success() || status->resumable() || !std::holds_alternative<std::monostate>(cause_))
        continue;
      cause_ = rank_failed{rank.rank(), *status};
      say("rank " + std::to_string(rank.rank()) + " " + status->describe() +
          "; stopping the other ranks (SIGTERM, then SIGKILL after " + grace_text() + ")");
      stop_all(SIGTERM);
    }
  }

  void on_launcher_signal(int signal_number) {
    if (std::holds_alternative<std::monostate>(cause_)) {
      cause_ = launcher_signalled{signal_number};
      say("received " + signal_name(signal_number) + "; forwarding it to every rank (SIGKILL after " + grace_text() +
          ")");
      stop_all(signal_number);
      return;
    }
    // Asked again while already stopping (a second Ctrl-C): stop now, as torchrun does, without
    // waiting out the grace period, and say so rather than that it passed.
    say("received " + signal_name(signal_number) +
        " while stopping the ranks: killing every rank still running now (SIGKILL)");
    kill_deadline_.reset();
    for (const rank_process& rank : ranks_)
      if (rank.running()) rank.send(SIGKILL);
  }

  void stop_all(int signal_number) {
    if (!options_.all_output)
      for (output_stream& output : outputs_) output.relay.leave_out_c10d_warnings();
    for (const rank_process& rank : ranks_) {
      if (!rank.running()) continue;
      rank.send(signal_number);
      rank.send(SIGCONT);  // a stopped rank (SIGSTOP, a hang's suspect) acts on the signal only once continued
    }
    kill_deadline_ = steady::now() + std::chrono::duration_cast<steady::duration>(
                                         std::chrono::duration<double>{options_.grace_seconds});
  }

  void kill_after_grace() {
    if (!kill_deadline_ || steady::now() < *kill_deadline_) return;
    kill_deadline_.reset();
    for (const rank_process& rank : ranks_) {
      if (!rank.running()) continue;
      say("rank " + std::to_string(rank.rank()) + " still runs after the grace period; sending SIGKILL");
      rank.send(SIGKILL);
    }
  }

  std::string grace_text() const {
    std::string seconds = std::to_string(options_.grace_seconds);
    seconds.erase(seconds.find_last_not_of('0') + 1);  // 10.000000 -> 10.
    if (seconds.ends_with('.')) seconds.pop_back();
    return seconds + " s";
  }

  int report(int restarts) const {
    if (resumable_ranks_ > 0 && !std::holds_alternative<rank_failed>(cause_)) {
      say(std::to_string(resumable_ranks_) + " of " + std::to_string(ranks_count_) +
          " ranks stopped to be resumed (exit code " + std::to_string(exit_status::resumable_code) +
          "): run the same command again to continue from their checkpoint");
      return exit_status::resumable_code;
    }
    if (const auto* failed = std::get_if<rank_failed>(&cause_)) {
      const std::string after = restarts == 0
                                    ? std::string{}
                                    : " (after " + std::to_string(restarts) + " restart" + (restarts == 1 ? "" : "s") +
                                          ", none left: --max-restarts " + std::to_string(options_.max_restarts) + ")";
      const std::string rank = "rank " + std::to_string(failed->rank);
      if (const auto found = errors_.read(failed->rank); found && found->rank != failed->rank) {
        // The first to exit only found the rank at fault: a stopped or silent peer exits last, if at all.
        say("rank " + std::to_string(found->rank) + " failed first, as " + rank +
            "'s hang check found: " + found->error + "; " + rank + " then " + failed->status.describe() + after);
      } else {
        say(rank + " failed first: " + failed->status.describe() + after);
      }
      return 1;
    }
    if (const auto* signalled = std::get_if<launcher_signalled>(&cause_)) {
      say("stopped by " + signal_name(signalled->signal_number) + ", which every rank received");
      return 128 + signalled->signal_number;
    }
    return 0;
  }

  const launch_options& options_;
  // SIGUSR1 too: what cluster schedulers send before they stop a job, forwarded like SIGTERM.
  signal_pipe signals_{SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGCHLD};
  error_files errors_;
  std::vector<output_stream> outputs_;
  std::vector<rank_process> ranks_;  // destroyed first: no rank outlives the supervisor
  stop_cause cause_;
  int resumable_ranks_ = 0;
  int ranks_count_ = 0;
  std::optional<steady::time_point> kill_deadline_;
};

}  // namespace

int supervise(const launch_options& options) { return supervisor{options}.run(); }

}  // namespace loom::launcher

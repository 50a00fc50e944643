#include "run_folder_lock.hpp"

#include <loom/base/text.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <system_error>

#include <signal.h>
#include <unistd.h>

namespace loom {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string this_host() {
  std::array<char, 256> name{};
  if (gethostname(name.data(), name.size() - 1) != 0) return "unknown";
  return name.data();
}

std::string text_of(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// When a process started, in clock ticks after boot (/proc/PID/stat's 22nd field): with its pid, what
// tells it from a later process that was given the same pid. 0 where it cannot be read.
std::uint64_t process_start(long pid) {
  const std::string stat = text_of(fmt::format("/proc/{}/stat", pid));
  const auto name_end = stat.rfind(')');  // the name, field 2, may hold spaces and parentheses
  if (name_end == std::string::npos) return 0;
  std::istringstream fields(stat.substr(name_end + 1));
  std::string field;
  for (int number = 3; number <= 22; ++number) {
    if (!(fields >> field)) return 0;
  }
  try {
    return std::stoull(field);
  } catch (const std::exception&) {
    return 0;
  }
}

// Whether the process that wrote a lock on this host still runs: its pid is taken (by any user), by
// a process that started when it did.
bool still_runs(long pid, std::uint64_t started) {
  if (pid <= 0 || (::kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM)) return false;
  const std::uint64_t now = process_start(pid);
  return started == 0 || now == 0 || now == started;
}

std::string now_text() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::array<char, 64> text{};
  return std::strftime(text.data(), text.size(), "%Y-%m-%d %H:%M:%S %Z", &local) > 0 ? text.data() : "(unknown)";
}

// A lock's holder as a file records it.
struct holder {
  std::string host;
  long pid = 0;
  std::uint64_t started = 0;
  std::string since;
  std::string job;

  static std::optional<holder> read(const std::string& text) {
    const json file = json::parse(text, nullptr, /*allow_exceptions=*/false);
    try {
      if (!file.is_object()) return std::nullopt;
      return holder{.host = file.at("host").get<std::string>(),
                    .pid = file.at("pid").get<long>(),
                    .started = file.at("process_start").get<std::uint64_t>(),
                    .since = file.at("since").get<std::string>(),
                    .job = file.at("job").get<std::string>()};
    } catch (const json::exception&) {
      return std::nullopt;
    }
  }

  // "pid 1234 on host 'node-3' (rank 0 of 2 ranks at 10.0.0.3:29500)"
  [[nodiscard]] std::string named() const {
    return fmt::format("pid {} on host '{}'{}", pid, host, job.empty() ? std::string() : fmt::format(" ({})", job));
  }
};

}  // namespace

run_folder_lock::run_folder_lock(fs::path folder, std::string job) : file_(folder / file_name()) {
  const std::string host = this_host();
  const long pid = ::getpid();
  mine_ = json{{"host", host},
               {"pid", pid},
               {"process_start", process_start(pid)},
               {"since", now_text()},
               {"job", std::move(job)}}
              .dump(2) +
          "\n";
  const std::string folder_text = folder.string();
  const std::string elsewhere =
      "give this run another out folder (loom::train's out; --train.out=DIR with a run file), or wait for that job to "
      "end";
  // Written whole under a name of its own, then linked into place: link() fails when a lock is there,
  // so two jobs that start together cannot both take it, and no job reads half a lock.
  const fs::path written = folder / fmt::format(".loom.lock.{}.{}", host, pid);
  while (true) {
    {
      std::ofstream out(written, std::ios::binary | std::ios::trunc);
      out << mine_;
      if (!out.flush()) {
        throw_error<std::runtime_error>("train: the run folder '{}' cannot be locked: '{}' cannot be written: {}",
                                        folder_text, written.string(), std::strerror(errno));
      }
    }
    if (::link(written.c_str(), file_.c_str()) == 0) {
      fs::remove(written);
      return;
    }
    const int link_error = errno;
    if (link_error != EEXIST) {
      fs::remove(written);
      throw_error<std::runtime_error>("train: the run folder '{}' cannot be locked: linking '{}' failed: {}",
                                      folder_text, file_.string(), std::strerror(link_error));
    }
    const std::optional<holder> held = holder::read(text_of(file_));
    if (!held) {
      fs::remove(written);
      throw_error<std::runtime_error>(
          "train: the run folder '{}' holds a lock, '{}', that loom did not write: {}, or remove '{}' if no job "
          "runs in that folder",
          folder_text, file_.string(), elsewhere, file_.string());
    }
    const bool ours = held->host == host && held->pid == pid;
    if (!ours && held->host != host) {
      fs::remove(written);
      throw_error<std::runtime_error>(
          "train: the run folder '{}' is in use by another job: {} holds it since {}, on a host where this one cannot "
          "see whether it still runs; {}, or remove '{}' if that job is gone",
          folder_text, held->named(), held->since, elsewhere, file_.string());
    }
    if (!ours && still_runs(held->pid, held->started)) {
      fs::remove(written);
      throw_error<std::runtime_error>("train: the run folder '{}' is in use by another job: {} holds it since {}; {}",
                                      folder_text, held->named(), held->since, elsewhere);
    }
    // Its holder is gone (killed, or lost with its machine) without releasing it: taken over whole.
    fs::rename(written, file_);
    if (text_of(file_) != mine_) continue;  // another job took it over at the same moment: look again
    if (!ours) {
      fmt::print(stderr, "{}\n",
                 error_message("train: the run folder '{}' was locked by {} since {}, which no longer runs: this job "
                               "takes the lock over",
                               folder_text, held->named(), held->since));
      std::fflush(stderr);
    }
    return;
  }
}

run_folder_lock::~run_folder_lock() {
  std::error_code error;
  if (text_of(file_) == mine_) fs::remove(file_, error);
}

}  // namespace loom

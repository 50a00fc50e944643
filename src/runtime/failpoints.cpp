#include <loom/runtime/failpoints.hpp>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>

namespace loom {
namespace {

struct armed_failpoint {
  std::string name;
  long hit = 1;
  int error = 0;  // LOOM_FAILPOINT_ERRNO; 0: die
  int signal = SIGKILL;
  double sleep_s = 0;             // LOOM_FAILPOINT_SLEEP_S: sleep instead of a signal
  std::optional<double> value{};  // LOOM_FAILPOINT_VALUE: a factor instead of a signal
  bool skip = false;              // LOOM_FAILPOINT_SKIP: skipped instead of a signal
  std::atomic<long> passes{0};
};

int error_number(const char* name) {
  const std::string text = name == nullptr ? "" : name;
  if (text == "ENOSPC") return ENOSPC;
  if (text == "EDQUOT") return EDQUOT;
  if (text == "EIO") return EIO;
  return 0;
}

int signal_number(const char* name) {
  const std::string text = name == nullptr ? "" : name;
  if (text == "SIGSTOP") return SIGSTOP;
  if (text == "SIGTERM") return SIGTERM;
  if (text == "SIGSEGV") return SIGSEGV;
  return SIGKILL;
}

// Read once: the environment does not change under a running job.
armed_failpoint* armed() {
  static armed_failpoint* const point = []() -> armed_failpoint* {
    const char* name = std::getenv("LOOM_FAILPOINT");
    if (name == nullptr || *name == '\0') return nullptr;
    const char* rank = std::getenv("LOOM_FAILPOINT_RANK");
    const char* mine = std::getenv("RANK");
    if (rank != nullptr && std::string(rank) != (mine != nullptr ? mine : "0")) return nullptr;
    // Only in the attempt with this restart count (loom-run --max-restarts): a failure that happens once.
    const char* restart = std::getenv("LOOM_FAILPOINT_RESTART");
    const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
    if (restart != nullptr && std::string(restart) != (attempt != nullptr ? attempt : "0")) return nullptr;
    auto* point = new armed_failpoint{name};  // lives as long as the process
    if (const char* hit = std::getenv("LOOM_FAILPOINT_HIT")) point->hit = std::strtol(hit, nullptr, 10);
    point->error = error_number(std::getenv("LOOM_FAILPOINT_ERRNO"));
    point->signal = signal_number(std::getenv("LOOM_FAILPOINT_SIGNAL"));
    if (const char* sleep = std::getenv("LOOM_FAILPOINT_SLEEP_S")) point->sleep_s = std::strtod(sleep, nullptr);
    if (const char* value = std::getenv("LOOM_FAILPOINT_VALUE")) point->value = std::strtod(value, nullptr);
    if (const char* skip = std::getenv("LOOM_FAILPOINT_SKIP")) point->skip = std::string(skip) == "1";
    return point;
  }();
  return point;
}

}  // namespace

void failpoint(std::string_view name) {
  armed_failpoint* point = armed();
  if (point == nullptr || point->error != 0 || point->value || point->skip || point->name != name) return;
  if (++point->passes != point->hit) return;
  if (point->sleep_s > 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(point->sleep_s));
  } else {
    std::raise(point->signal);
  }
}

int injected_error(std::string_view name) {
  armed_failpoint* point = armed();
  if (point == nullptr || point->error == 0 || point->name != name) return 0;
  return ++point->passes == point->hit ? point->error : 0;
}

std::optional<double> injected_value(std::string_view name) {
  armed_failpoint* point = armed();
  if (point == nullptr || !point->value || point->name != name) return std::nullopt;
  return ++point->passes == point->hit ? point->value : std::nullopt;
}

bool injected_skip(std::string_view name) {
  armed_failpoint* point = armed();
  if (point == nullptr || !point->skip || point->name != name) return false;
  return ++point->passes == point->hit;
}

}  // namespace loom

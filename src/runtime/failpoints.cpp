#include <loom/runtime/failpoints.hpp>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <string>

namespace loom {
namespace {

struct armed_failpoint {
  std::string name;
  long hit = 1;
  std::atomic<long> passes{0};
};

// Read once: the environment does not change under a running job.
armed_failpoint* armed() {
  static armed_failpoint* const point = []() -> armed_failpoint* {
    const char* name = std::getenv("LOOM_FAILPOINT");
    if (name == nullptr || *name == '\0') return nullptr;
    const char* rank = std::getenv("LOOM_FAILPOINT_RANK");
    const char* mine = std::getenv("RANK");
    if (rank != nullptr && std::string(rank) != (mine != nullptr ? mine : "0")) return nullptr;
    auto* point = new armed_failpoint{name};  // lives as long as the process
    if (const char* hit = std::getenv("LOOM_FAILPOINT_HIT")) point->hit = std::strtol(hit, nullptr, 10);
    return point;
  }();
  return point;
}

}  // namespace

void failpoint(std::string_view name) {
  armed_failpoint* point = armed();
  if (point == nullptr || point->name != name) return;
  if (++point->passes == point->hit) std::raise(SIGKILL);
}

}  // namespace loom

#include "malloc_tuning.hpp"

#include <algorithm>
#include <array>

namespace loom::launcher {
namespace {

struct tunable {
  std::string_view name;
  std::string_view value;
};

constexpr std::array malloc_tunables{
    tunable{"glibc.malloc.mmap_threshold", "33554432"},
    tunable{"glibc.malloc.trim_threshold", "1073741824"},
};

// Whether the colon-separated NAME=VALUE list `tunables` sets `name`.
bool sets(std::string_view tunables, std::string_view name) {
  while (!tunables.empty()) {
    const std::string_view entry = tunables.substr(0, tunables.find(':'));
    if (entry.starts_with(name) && entry.size() > name.size() && entry[name.size()] == '=') return true;
    tunables.remove_prefix(std::min(tunables.size(), entry.size() + 1));
  }
  return false;
}

}  // namespace

std::string with_malloc_tuning(std::string_view inherited) {
  std::string tunables{inherited};
  for (const auto& [name, value] : malloc_tunables) {
    if (sets(inherited, name)) continue;
    if (!tunables.empty()) tunables += ':';
    tunables.append(name).append("=").append(value);
  }
  return tunables;
}

}  // namespace loom::launcher

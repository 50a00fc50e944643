#include "malloc_tuning.hpp"

#include <algorithm>
#include <array>
#include <system_error>

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

std::vector<std::filesystem::path> allocator_folders(std::string_view ld_library_path) {
  std::vector<std::filesystem::path> folders;
  while (!ld_library_path.empty()) {
    const std::string_view folder = ld_library_path.substr(0, ld_library_path.find(':'));
    if (!folder.empty()) folders.emplace_back(folder);
    ld_library_path.remove_prefix(std::min(ld_library_path.size(), folder.size() + 1));
  }
  for (const std::string_view system :
       {"/usr/local/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib"})
    folders.emplace_back(system);
  return folders;
}

std::filesystem::path find_allocator(heap_allocator allocator, std::span<const std::filesystem::path> folders) {
  struct library {
    std::string_view flag;
    std::array<std::string_view, 4> names;  // the first is the one named in errors
    std::string_view packages;
  };
  const library wanted =
      allocator == heap_allocator::jemalloc
          ? library{"--enable-jemalloc",
                    {"libjemalloc.so.2", "libjemalloc.so", "", ""},
                    "Debian and Ubuntu: apt install libjemalloc2; conda: conda install -c conda-forge jemalloc"}
          : library{"--enable-tcmalloc",
                    {"libtcmalloc_minimal.so.4", "libtcmalloc.so.4", "libtcmalloc_minimal.so", "libtcmalloc.so"},
                    "Debian and Ubuntu: apt install libtcmalloc-minimal4; conda: conda install -c conda-forge "
                    "gperftools"};
  std::string looked;
  for (const std::filesystem::path& folder : folders) {
    for (const std::string_view name : wanted.names) {
      std::error_code error;
      if (!name.empty() && std::filesystem::is_regular_file(folder / name, error)) return folder / name;
    }
    looked += (looked.empty() ? "" : ", ") + folder.string();
  }
  throw usage_error{"loom-run: " + std::string{wanted.flag} + " found no " + std::string{wanted.names[0]} +
                    " in LD_LIBRARY_PATH or the system's library folders (" + looked + "): install it (" +
                    std::string{wanted.packages} + "), or add its folder to LD_LIBRARY_PATH"};
}

}  // namespace loom::launcher

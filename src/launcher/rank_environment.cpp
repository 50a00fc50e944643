#include "rank_environment.hpp"

#include "malloc_tuning.hpp"
#include "unique_fd.hpp"

#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <string_view>
#include <system_error>
#include <thread>

extern char** environ;

namespace loom::launcher {
namespace {

int pick_free_port() {
  const unique_fd socket_fd{::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  if (!socket_fd.valid()) throw std::system_error{errno, std::generic_category(), "socket"};
  // Any address, as the TCPStore server listens on every interface.
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = 0;
  socklen_t length = sizeof address;
  if (::bind(socket_fd.get(), reinterpret_cast<const sockaddr*>(&address), length) != 0 ||
      ::getsockname(socket_fd.get(), reinterpret_cast<sockaddr*>(&address), &length) != 0)
    throw std::system_error{errno, std::generic_category(), "picking a free port"};
  return ntohs(address.sin_port);
}

// Matches the NAME=VALUE entry for `name`.
auto entry_for(std::string_view name) {
  return [name](const std::string& entry) {
    return entry.starts_with(name) && entry.size() > name.size() && entry[name.size()] == '=';
  };
}

// NAME's value in `environment`, empty when it is not set.
std::string_view value_of(const std::vector<std::string>& environment, std::string_view name) {
  const auto existing = std::ranges::find_if(environment, entry_for(name));
  return existing == environment.end() ? std::string_view{} : std::string_view{*existing}.substr(name.size() + 1);
}

void set_variable(std::vector<std::string>& environment, std::string_view name, std::string_view value) {
  std::string entry = std::string{name} + "=" + std::string{value};
  const auto existing = std::ranges::find_if(environment, entry_for(name));
  if (existing != environment.end())
    *existing = std::move(entry);
  else
    environment.push_back(std::move(entry));
}

void set_variable(std::vector<std::string>& environment, std::string_view name, int value) {
  set_variable(environment, name, std::to_string(value));
}

}  // namespace

rendezvous_point resolve_rendezvous(const launch_options& options) {
  return {.address = options.master_addr.value_or("127.0.0.1"),
          .port = options.master_port ? *options.master_port : pick_free_port()};
}

int available_cores() {
  cpu_set_t mask;
  if (::sched_getaffinity(0, sizeof mask, &mask) == 0) return std::max(1, CPU_COUNT(&mask));
  return static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
}

std::vector<std::string> current_environment() {
  std::vector<std::string> environment;
  for (char** entry = environ; *entry != nullptr; ++entry) environment.emplace_back(*entry);
  return environment;
}

std::vector<std::string> rank_environment(std::vector<std::string> inherited, const launch_options& options,
                                          const rendezvous_point& master, int restart_count, int local_rank, int cores,
                                          const std::string& error_file) {
  const int world_size = options.nnodes * options.nproc_per_node;
  const int rank = options.node_rank * options.nproc_per_node + local_rank;
  set_variable(inherited, "RANK", rank);
  set_variable(inherited, "LOCAL_RANK", local_rank);
  set_variable(inherited, "WORLD_SIZE", world_size);
  set_variable(inherited, "LOCAL_WORLD_SIZE", options.nproc_per_node);
  set_variable(inherited, "GROUP_RANK", options.node_rank);
  set_variable(inherited, "GROUP_WORLD_SIZE", options.nnodes);
  set_variable(inherited, "ROLE_NAME", "default");
  set_variable(inherited, "ROLE_RANK", rank);
  set_variable(inherited, "ROLE_WORLD_SIZE", world_size);
  set_variable(inherited, "MASTER_ADDR", master.address);
  set_variable(inherited, "MASTER_PORT", master.port);
  set_variable(inherited, "TORCHELASTIC_RESTART_COUNT", restart_count);
  set_variable(inherited, "TORCHELASTIC_MAX_RESTARTS", options.max_restarts);
  // No agent hosts a store here: rank 0 does, as under torchrun's static rendezvous. An
  // inherited "True" (loom-run started inside a torchrun job) would send ranks to a store
  // that is not theirs.
  set_variable(inherited, "TORCHELASTIC_USE_AGENT_STORE", "False");
  set_variable(inherited, "LOOM_ERROR_FILE", error_file);
  if (std::ranges::none_of(inherited, entry_for("OMP_NUM_THREADS")))
    set_variable(inherited, "OMP_NUM_THREADS", std::max(1, cores / options.nproc_per_node));
  switch (options.allocator) {
    case heap_allocator::tuned_glibc:
      set_variable(inherited, "GLIBC_TUNABLES", with_malloc_tuning(value_of(inherited, "GLIBC_TUNABLES")));
      break;
    case heap_allocator::glibc: break;
    case heap_allocator::tcmalloc:
    case heap_allocator::jemalloc: {
      // First, so that it is the malloc every other library binds to; a user's own preloads follow.
      const std::string_view preloaded = value_of(inherited, "LD_PRELOAD");
      const std::string library =
          find_allocator(options.allocator, allocator_folders(value_of(inherited, "LD_LIBRARY_PATH"))).string();
      set_variable(inherited, "LD_PRELOAD", preloaded.empty() ? library : library + ":" + std::string{preloaded});
      if (options.allocator == heap_allocator::jemalloc && value_of(inherited, "MALLOC_CONF").empty())
        set_variable(inherited, "MALLOC_CONF", jemalloc_conf);
      break;
    }
  }
  return inherited;
}

}  // namespace loom::launcher

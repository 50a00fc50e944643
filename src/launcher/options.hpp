#pragma once

#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace loom::launcher {

// The ranks' heap allocator (malloc_tuning.hpp): glibc's malloc with loom's tuning by default, glibc's
// as it is (--use-default-allocator), or tcmalloc or jemalloc preloaded, as PyTorch's CPU launcher
// (torch.backends.xeon.run_cpu) offers them (--enable-tcmalloc, --enable-jemalloc).
enum class heap_allocator { tuned_glibc, glibc, tcmalloc, jemalloc };

// What the command line asks for; the defaults are torchrun's.
struct launch_options {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::optional<std::string> master_addr;  // single node: 127.0.0.1
  std::optional<int> master_port;          // single node: a free port; several nodes: 29500
  bool prefix_output = true;
  bool all_output = false;  // keep c10d's warnings from ranks being stopped (c10d_warnings.hpp)
  heap_allocator allocator = heap_allocator::tuned_glibc;
  double grace_seconds = 10.0;       // from SIGTERM to SIGKILL when stopping the ranks
  int max_restarts = 0;              // torchrun's: how often every rank is started again after a failure
  std::vector<std::string> program;  // the program, then its arguments
  // What loom-run took from its environment, or left there (PET_MASTER_PORT, MASTER_PORT, ...): a
  // line each, said before the ranks start.
  std::vector<std::string> notes;
};

struct help_requested {};
struct version_requested {};

// A malformed command line; what() is one sentence naming the flag and the accepted form.
class usage_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// `args` excludes argv[0]; a master the flags do not give is read from PET_MASTER_ADDR and
// PET_MASTER_PORT, as torchrun reads them. Throws usage_error.
[[nodiscard]] std::variant<launch_options, help_requested, version_requested> parse_command_line(
    std::span<const std::string_view> args);

[[nodiscard]] std::string_view usage_text();

}  // namespace loom::launcher

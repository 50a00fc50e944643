#pragma once
// What torchrun and loom-run tell a process about its place in the job, parsed and validated.
// Torch-free, so that the parsing and its error messages are tested without LibTorch.

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

enum class backend_kind { gloo, nccl };

// LOOM_DEVICE: where a rank's parameters and collectives live. "cuda" is cuda:LOCAL_RANK;
// "cuda:N" names one device (several ranks may share it under Gloo).
struct device_request {
  static constexpr int local_rank = -1;
  bool cuda = false;
  int index = local_rank;  // a device index, or cuda:LOCAL_RANK
  [[nodiscard]] bool names_index() const noexcept { return index != local_rank; }
};

[[nodiscard]] std::string_view to_string(backend_kind kind) noexcept;

// A launch environment that cannot work: the message names the variable and its accepted form.
class launch_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct launch_env {
  static constexpr std::chrono::milliseconds default_timeout{std::chrono::seconds(300)};
  static constexpr std::chrono::milliseconds default_hang_check{std::chrono::seconds(5)};

  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  std::string master_addr;  // empty for a single process
  std::uint16_t master_port = 0;
  bool agent_store = false;                             // TORCHELASTIC_USE_AGENT_STORE: every rank is a store client
  int restart_count = 0;                                // TORCHELASTIC_RESTART_COUNT: names the store's key space
  std::chrono::milliseconds timeout = default_timeout;  // LOOM_TIMEOUT_S: rendezvous and collectives
  // LOOM_HANG_CHECK_S: how long a rank waits on collectives before it checks that its peers can
  // still join it (loom/runtime/hang_check.hpp); zero turns the check off.
  std::chrono::milliseconds hang_check = default_hang_check;
  std::optional<backend_kind> backend;   // LOOM_BACKEND; unset: chosen by device
  std::optional<device_request> device;  // LOOM_DEVICE; unset: CUDA when NCCL can serve it
  // TORCH_SHOW_CPP_STACKTRACES, as PyTorch reads it: whether c10's errors keep their C++ backtrace
  // (the "frame #N" lines that c10d's warnings print); loom's own messages never carry one.
  bool show_cpp_stack_traces = false;
  // LOOM_ERROR_FILE (loom-run sets one a rank, as torchrun sets TORCHELASTIC_ERROR_FILE): where a
  // rank whose hang check stops the job writes which rank it found at fault, and why, for loom-run's
  // last line: the rank's number on the first line, the error after it. Empty: nowhere.
  std::string error_file;

  [[nodiscard]] bool is_distributed() const noexcept { return world_size > 1; }
  [[nodiscard]] bool is_launched() const noexcept { return !master_addr.empty(); }
  // Whether this rank's process hosts the rendezvous store (rank 0's, unless the launcher's agent does).
  [[nodiscard]] bool hosts_store() const noexcept { return !agent_store && rank == 0; }
  // A process group for more than one rank, or for one launched rank that names its backend
  // (LOOM_BACKEND), so that a single GPU exercises a real NCCL group.
  [[nodiscard]] bool needs_process_group() const noexcept {
    return is_distributed() || (is_launched() && backend.has_value());
  }
};

// Looks a variable up; the default reads the process environment.
using env_lookup = std::function<std::optional<std::string>(const char* name)>;

[[nodiscard]] std::optional<std::string> process_env(const char* name);

// Reads RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
// TORCHELASTIC_USE_AGENT_STORE, TORCHELASTIC_RESTART_COUNT, LOOM_BACKEND, LOOM_DEVICE, LOOM_TIMEOUT_S,
// LOOM_HANG_CHECK_S, LOOM_ERROR_FILE and TORCH_SHOW_CPP_STACKTRACES.
// None of the launcher's variables set means a single process. Throws launch_error.
[[nodiscard]] launch_env parse_launch_env(const env_lookup& lookup = process_env);

// A variable of the process environment, and the value loom gives it.
struct environment_setting {
  std::string name;
  std::string value;
  friend bool operator==(const environment_setting&, const environment_setting&) = default;
};

// ProcessGroupNCCL's own safety nets, set from loom's settings for those variables the user left
// unset (a user's value is kept): errors handled asynchronously (a collective past the timeout ends
// the process, which loom-run sees), the flight recorder's ring of the last collectives and its dump
// when one times out, and the watchdog's monitor, given the timeout and a minute more to report.
// Read when a ProcessGroupNCCL is made, so they are set before the first one.
[[nodiscard]] std::vector<environment_setting> nccl_environment(const launch_env& env,
                                                                const env_lookup& lookup = process_env);

}  // namespace loom

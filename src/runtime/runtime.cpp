#include <loom/runtime/failures.hpp>
#include <loom/runtime/heartbeat.hpp>
#include <loom/runtime/runtime.hpp>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef LOOM_HAVE_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <ATen/Context.h>
#include <fmt/format.h>

#include <cmath>
#include <csignal>
#include <utility>

namespace loom {
namespace {

std::string seconds(std::chrono::milliseconds timeout) {
  return fmt::format("{:g} s", static_cast<double>(timeout.count()) / 1000.0);
}

constexpr bool compiled_with_nccl() {
#ifdef LOOM_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

backend_kind choose_backend(const launch_env& env) {
  if (!env.backend) return compiled_with_nccl() && at::hasCUDA() ? backend_kind::nccl : backend_kind::gloo;
  if (*env.backend == backend_kind::nccl) {
    if (!compiled_with_nccl()) {
      throw launch_error(
          "loom: LOOM_BACKEND=nccl, but this loom was built without NCCL (a CPU LibTorch, or "
          "-Dnccl=disabled): use LOOM_BACKEND=gloo, or rebuild against a CUDA LibTorch");
    }
    if (!at::hasCUDA()) {
      throw launch_error("loom: LOOM_BACKEND=nccl, but no CUDA device is visible: use LOOM_BACKEND=gloo");
    }
  }
  return *env.backend;
}

c10::intrusive_ptr<c10d::Store> rendezvous(const launch_env& env) {
  c10d::TCPStoreOptions options;
  options.port = env.master_port;
  options.isServer = !env.agent_store && env.rank == 0;
  options.numWorkers = env.agent_store ? std::nullopt : std::optional<std::size_t>(env.world_size);
  options.waitWorkers = !env.agent_store;
  options.timeout = env.timeout;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
  } catch (const std::exception& error) {
    throw launch_error(
        fmt::format("loom: rank {} could not rendezvous at MASTER_ADDR={} MASTER_PORT={} within {} (LOOM_TIMEOUT_S): "
                    "{}; check that rank 0 is running and that this address and port are reachable",
                    env.rank, env.master_addr, env.master_port, seconds(env.timeout), error_text(error)));
  }
  if (env.agent_store) {
    // torchrun's agent hosts the store; each restart of the workers gets a fresh key space.
    store =
        c10::make_intrusive<c10d::PrefixStore>(fmt::format("/worker/attempt_{}", env.restart_count), std::move(store));
  }
  return store;
}

// A peer that dies closes its sockets, and Gloo's next write to one raises SIGPIPE, whose default
// action kills this rank before it can say why. Python ignores SIGPIPE in every PyTorch program;
// loom does the same for a distributed job, unless the program installed a handler of its own.
void ignore_broken_pipes() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) std::signal(SIGPIPE, SIG_IGN);
}

bool is_loopback(const std::string& address) {
  return address == "localhost" || address.starts_with("127.") || address == "::1";
}

std::shared_ptr<::gloo::transport::Device> gloo_device(const launch_env& env) {
  if (auto interface = process_env("GLOO_SOCKET_IFNAME")) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(*interface);
  }
  if (is_loopback(env.master_addr)) return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

c10::intrusive_ptr<c10d::Backend> make_gloo(const c10::intrusive_ptr<c10d::Store>& store, const launch_env& env) {
  auto options = c10d::ProcessGroupGloo::Options::create(env.timeout);
  options->devices.push_back(gloo_device(env));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(c10::make_intrusive<c10d::PrefixStore>("gloo", store), env.rank,
                                                     env.world_size, options);
}

#ifdef LOOM_HAVE_NCCL
c10::intrusive_ptr<c10d::Backend> make_nccl(const c10::intrusive_ptr<c10d::Store>& store, const launch_env& env) {
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(env.local_rank));
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = env.timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(c10::make_intrusive<c10d::PrefixStore>("nccl", store), env.rank,
                                                     env.world_size, options);
}
#endif

}  // namespace

struct runtime::state {
  launch_env env;
  backend_kind backend = backend_kind::gloo;
  c10::Device device = c10::Device(c10::kCPU);
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  std::unique_ptr<collectives> comm;
  std::unique_ptr<heartbeat> pulse;  // after the store: stops beating before the store goes
};

runtime runtime::from_env() { return runtime(parse_launch_env()); }

runtime runtime::single_process() { return runtime(launch_env{}); }

runtime::runtime(const launch_env& env) : state_(std::make_shared<state>()) {
  state& s = *state_;
  s.env = env;
  s.backend = choose_backend(env);
  if (s.backend == backend_kind::nccl)
    s.device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
  if (!env.is_distributed()) {
    s.comm = std::make_unique<collectives>(nullptr, 0, 1);
    return;
  }

  ignore_broken_pipes();
  s.store = rendezvous(env);
  s.group = c10::make_intrusive<c10d::ProcessGroup>(s.store, env.rank, env.world_size);
  c10::intrusive_ptr<c10d::Backend> device_backend;
  try {
    auto gloo = make_gloo(s.store, env);
    s.group->setBackend(c10::kCPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
    device_backend = gloo;
#ifdef LOOM_HAVE_NCCL
    if (s.backend == backend_kind::nccl) {
      device_backend = make_nccl(s.store, env);
      s.group->setBackend(c10::kCUDA, c10d::ProcessGroup::BackendType::NCCL, device_backend);
    }
#endif
  } catch (const std::exception& error) {
    throw launch_error(fmt::format("loom: rank {} could not create the {} process group of {} ranks within {}: {}",
                                   env.rank, to_string(s.backend), env.world_size, seconds(env.timeout),
                                   error_text(error)));
  }
  s.group->setDefaultBackend(s.backend == backend_kind::nccl ? c10d::ProcessGroup::BackendType::NCCL
                                                             : c10d::ProcessGroup::BackendType::GLOO);
  s.group->setGroupName("loom.world");
  s.comm = std::make_unique<collectives>(device_backend, env.rank, env.world_size);
  s.pulse = std::make_unique<heartbeat>(s.store, env.rank, env.world_size);
}

int runtime::rank() const noexcept { return state_->env.rank; }
int runtime::local_rank() const noexcept { return state_->env.local_rank; }
int runtime::world_size() const noexcept { return state_->env.world_size; }
backend_kind runtime::backend() const noexcept { return state_->backend; }
c10::Device runtime::device() const noexcept { return state_->device; }
std::chrono::milliseconds runtime::timeout() const noexcept { return state_->env.timeout; }
const launch_env& runtime::env() const noexcept { return state_->env; }
collectives& runtime::comm() const noexcept { return *state_->comm; }
const c10::intrusive_ptr<c10d::ProcessGroup>& runtime::process_group() const noexcept { return state_->group; }
const c10::intrusive_ptr<c10d::Store>& runtime::store() const noexcept { return state_->store; }

std::vector<int> runtime::silent_ranks(std::chrono::milliseconds window) const {
  return state_->pulse ? state_->pulse->silent_ranks(window) : std::vector<int>{};
}

}  // namespace loom

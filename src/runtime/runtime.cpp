#include "backends.hpp"
#include "store_hold.hpp"

#include <loom/base/text.hpp>
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
#include <c10/util/Backtrace.h>
#include <c10/util/Logging.h>
#include <fmt/format.h>
#include <gloo/context.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <utility>

namespace loom {
namespace {

// Every rank of a world of `size`, as a collective_group's members: a group over all of them that is
// not the world's own communicator.
std::vector<int> all_ranks(int size) {
  std::vector<int> ranks(static_cast<std::size_t>(size));
  std::iota(ranks.begin(), ranks.end(), 0);
  return ranks;
}

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

// Where this rank's tensors live: LOOM_DEVICE, else what LOOM_BACKEND implies, else CUDA when this
// build can serve it with NCCL and a device is visible. Each rank takes cuda:LOCAL_RANK unless
// LOOM_DEVICE names one.
c10::Device choose_device(const launch_env& env) {
  const bool cuda = env.device    ? env.device->cuda
                    : env.backend ? *env.backend == backend_kind::nccl
                                  : compiled_with_nccl() && at::hasCUDA();
  if (!cuda) return c10::Device(c10::kCPU);
  const std::string asked = env.device ? "LOOM_DEVICE=cuda" : "LOOM_BACKEND=nccl";
  if (!compiled_with_nccl()) {
    throw_error<launch_error>(
        "{}, but this loom was built without CUDA and NCCL (a CPU LibTorch, or -Dnccl=disabled): use {}, or "
        "rebuild against a CUDA LibTorch (docs/gpu.md)",
        asked, env.device ? "LOOM_DEVICE=cpu" : "LOOM_BACKEND=gloo");
  }
  const int visible = at::hasCUDA() ? static_cast<int>(at::getNumGPUs()) : 0;
  const int index = env.device && env.device->names_index() ? env.device->index : env.local_rank;
  if (index >= visible) {
    throw launch_error(
        env.device && env.device->names_index()
            ? error_message("LOOM_DEVICE=cuda:{}, but {} CUDA device(s) are visible (CUDA_VISIBLE_DEVICES)", index,
                            visible)
            : error_message("local rank {} would use cuda:{}, but {} CUDA device(s) are visible: run at most {} "
                            "rank(s) per node, or share one device with LOOM_DEVICE=cuda:0 LOOM_BACKEND=gloo",
                            env.local_rank, index, visible, visible));
  }
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
}

// NCCL for CUDA tensors, Gloo for CPU ones, unless LOOM_BACKEND says otherwise.
backend_kind choose_backend(const launch_env& env, c10::Device device) {
  const backend_kind backend = env.backend.value_or(device.is_cuda() ? backend_kind::nccl : backend_kind::gloo);
  if (backend == backend_kind::nccl && !device.is_cuda()) {
    throw_error<launch_error>(
        "LOOM_BACKEND=nccl reduces CUDA tensors, but LOOM_DEVICE=cpu: use LOOM_BACKEND=gloo, "
        "or LOOM_DEVICE=cuda");
  }
  if (backend == backend_kind::nccl && env.device && env.device->names_index() && env.local_world_size > 1) {
    throw_error<launch_error>(
        "LOOM_DEVICE=cuda:{} puts all {} local ranks on one device, which NCCL refuses: use LOOM_DEVICE=cuda "
        "(one device a rank), or LOOM_BACKEND=gloo to share it",
        env.device->index, env.local_world_size);
  }
  return backend;
}

// Fails at once, naming the variable, where TCPStore would retry until the timeout: a master
// address that does not resolve, or (on rank 0, which hosts the store) a port already taken.
void check_rendezvous_address(const launch_env& env) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int error = ::getaddrinfo(env.master_addr.c_str(), nullptr, &hints, &found); error != 0) {
    throw_error<launch_error>("MASTER_ADDR={} does not resolve ({}): give node 0's host name or IP address",
                              env.master_addr, ::gai_strerror(error));
  }
  ::freeaddrinfo(found);
  if (!env.hosts_store()) return;
  const int probe = ::socket(AF_INET, SOCK_STREAM, 0);
  if (probe < 0) return;  // nothing to learn here; TCPStore reports its own failure
  const int reuse = 1;    // as TCPStore binds: a port in TIME_WAIT is free
  ::setsockopt(probe, SOL_SOCKET, SO_REUSEADDR, &reuse, sizeof reuse);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = htons(env.master_port);
  const bool taken =
      ::bind(probe, reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0 && errno == EADDRINUSE;
  ::close(probe);
  if (taken) {
    throw_error<launch_error>(
        "MASTER_PORT={} is already in use on rank 0's host, where the rendezvous "
        "listens: choose another port (loom-run picks a free one when --master-port is not "
        "given), or stop the program that holds it",
        env.master_port);
  }
}

// How long a rendezvous goes before a rank says what it waits for, once (as torchrun's does).
constexpr std::chrono::seconds rendezvous_announcement{5};

// Says `announcement` on stderr, once, if this object still lives `rendezvous_announcement` after it
// was made: the wait it stands for has not ended by then.
class announce_if_long {
 public:
  explicit announce_if_long(std::string announcement)
      : thread_([this, text = std::move(announcement)] {
          std::unique_lock lock(mutex_);
          if (!done_cv_.wait_for(lock, rendezvous_announcement, [this] { return done_; })) {
            fmt::print(stderr, "{}\n", error_message("{}", text));
            std::fflush(stderr);
          }
        }) {}
  ~announce_if_long() {
    {
      const std::lock_guard lock(mutex_);
      done_ = true;
    }
    done_cv_.notify_one();
    thread_.join();
  }
  announce_if_long(const announce_if_long&) = delete;
  announce_if_long& operator=(const announce_if_long&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::thread thread_;  // last: it starts once the rest is made
};

// Every rank counts itself in, and the first on each node counts the node; then each waits for all.
// Rank 0 says, once and early, how many have joined, and a rendezvous short of ranks at the timeout
// names how many came, rather than c10d's bare timeout.
void wait_for_every_rank(c10d::Store& store, const launch_env& env) {
  const std::string ranks_key = fmt::format("/loom/attempt_{}/ranks_joined", env.restart_count);
  const std::string nodes_key = fmt::format("/loom/attempt_{}/nodes_joined", env.restart_count);
  store.add(ranks_key, 1);
  if (env.local_rank == 0) store.add(nodes_key, 1);
  const int nodes = std::max(1, env.world_size / std::max(1, env.local_world_size));
  const auto joined = [&] {
    return fmt::format("{} of {} ranks ({} of {} nodes)", store.add(ranks_key, 0), env.world_size,
                       store.add(nodes_key, 0), nodes);
  };
  const auto start = std::chrono::steady_clock::now();
  bool announced = false;
  while (store.add(ranks_key, 0) < env.world_size) {
    const auto waited = std::chrono::steady_clock::now() - start;
    if (waited >= env.timeout) {
      throw_error<launch_error>(
          "only {} joined the rendezvous at {}:{} within {} (LOOM_TIMEOUT_S): start loom-run on every node with "
          "--nnodes {} --master-addr {} --master-port {}, each with its --node-rank",
          joined(), env.master_addr, env.master_port, seconds(env.timeout), nodes, env.master_addr, env.master_port);
    }
    if (env.rank == 0 && !announced && waited >= rendezvous_announcement) {
      announced = true;
      fmt::print(stderr, "{}\n",
                 error_message("rank 0 waits for the rendezvous at {}:{}: {} have joined; it gives up after {} "
                               "(LOOM_TIMEOUT_S)",
                               env.master_addr, env.master_port, joined(), seconds(env.timeout)));
      std::fflush(stderr);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

c10::intrusive_ptr<c10d::Store> rendezvous(const launch_env& env) {
  check_rendezvous_address(env);
  c10d::TCPStoreOptions options;
  options.port = env.master_port;
  options.isServer = env.hosts_store();
  options.numWorkers = env.agent_store ? std::nullopt : std::optional<std::size_t>(env.world_size);
  options.waitWorkers = false;  // loom waits itself, saying for whom (wait_for_every_rank)
  options.timeout = env.timeout;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    const announce_if_long announcement(
        fmt::format("rank {} waits to reach the rendezvous at {}:{} (rank 0's node); it gives up after {} "
                    "(LOOM_TIMEOUT_S)",
                    env.rank, env.master_addr, env.master_port, seconds(env.timeout)));
    store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
  } catch (const std::exception& error) {
    throw_error<launch_error>(
        "rank {} could not rendezvous at MASTER_ADDR={} MASTER_PORT={} within {} (LOOM_TIMEOUT_S): "
        "{}; check that rank 0 is running and that this address and port are reachable",
        env.rank, env.master_addr, env.master_port, seconds(env.timeout), error_text(error));
  }
  if (!env.agent_store) wait_for_every_rank(*store, env);
  // Each restart of the workers gets a fresh key space (torchrun's agent hosts the store then; under
  // loom-run rank 0 does, on a new port on one node): no rank of an earlier attempt meets a later one.
  return c10::make_intrusive<c10d::PrefixStore>(fmt::format("/worker/attempt_{}", env.restart_count), std::move(store));
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

// The address this host reaches MASTER_ADDR from, which is where the other nodes reach it too (no
// packet is sent: connecting a UDP socket only picks the route). Nothing when there is no route.
std::optional<std::string> address_towards_master(const launch_env& env) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(env.master_addr.c_str(), std::to_string(env.master_port).c_str(), &hints, &found) != 0) {
    return std::nullopt;
  }
  std::optional<std::string> address;
  const int probe = ::socket(found->ai_family, SOCK_DGRAM, 0);
  sockaddr_storage local{};
  socklen_t length = sizeof local;
  if (probe >= 0 && ::connect(probe, found->ai_addr, found->ai_addrlen) == 0 &&
      ::getsockname(probe, reinterpret_cast<sockaddr*>(&local), &length) == 0) {
    char text[INET6_ADDRSTRLEN] = {};
    const void* bytes = local.ss_family == AF_INET6
                            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr)
                            : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr);
    if (::inet_ntop(local.ss_family, bytes, text, sizeof text) != nullptr) address = text;
  }
  if (probe >= 0) ::close(probe);
  ::freeaddrinfo(found);
  return address;
}

// Where this rank's Gloo listens and what it tells its peers: GLOO_SOCKET_IFNAME's interface when
// set (as in PyTorch); else the address of the route to MASTER_ADDR, rather than what the host name
// resolves to, which in many containers is a loopback address the other nodes cannot reach.
std::shared_ptr<::gloo::transport::Device> gloo_device(const launch_env& env) {
  if (auto interface = process_env("GLOO_SOCKET_IFNAME")) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(*interface);
  }
  if (is_loopback(env.master_addr)) return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  if (auto address = address_towards_master(env)) return c10d::ProcessGroupGloo::createDeviceForHostname(*address);
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

// c10d's Gloo backend with the abort that c10d gives NCCL's alone: every connection of its
// contexts closed, so that each peer's wait on this rank breaks at once.
class abortable_gloo final : public c10d::ProcessGroupGloo {
 public:
  using ProcessGroupGloo::ProcessGroupGloo;
  void abort() override {
    for (const auto& context : contexts_) context->closeConnections();
  }
};

}  // namespace

c10::intrusive_ptr<c10d::Backend> make_gloo(const c10::intrusive_ptr<c10d::Store>& store, const launch_env& env,
                                            int rank, int size, job_failures& failures) {
  auto options = c10d::ProcessGroupGloo::Options::create(env.timeout);
  options->devices.push_back(gloo_device(env));
  c10::intrusive_ptr<c10d::Backend> backend =
      c10::make_intrusive<abortable_gloo>(c10::make_intrusive<c10d::PrefixStore>("gloo", store), rank, size, options);
  failures.enlist(backend);
  return backend;
}

#ifdef LOOM_HAVE_NCCL
c10::intrusive_ptr<c10d::Backend> make_nccl(const c10::intrusive_ptr<c10d::Store>& store, const launch_env& env,
                                            int rank, int size, const std::string& name, c10::Device device,
                                            job_failures& failures) {
  for (const environment_setting& setting : nccl_environment(env)) {
    ::setenv(setting.name.c_str(), setting.value.c_str(), /*overwrite=*/0);
  }
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = env.timeout;
  options->group_name = name;
  auto backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(c10::make_intrusive<c10d::PrefixStore>("nccl", store),
                                                             rank, size, options);
  backend->setBoundDeviceId(device);
  backend->eagerConnectSingleDevice(device);
  failures.enlist(backend);
  return backend;
}
#endif

struct runtime::state {
  launch_env env;
  backend_kind backend = backend_kind::gloo;
  c10::Device device = c10::Device(c10::kCPU);
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  job_progress progress;                   // before failures, comm and pulse, which hold it
  std::unique_ptr<job_failures> failures;  // before pulse, which holds it
  std::unique_ptr<collectives> comm;
  std::unique_ptr<collectives> host_comm;  // set when comm's backend is not Gloo
  std::unique_ptr<heartbeat> pulse;        // after the store: stops beating before the store goes
  // A runtime over some of the world's ranks (among): the world's, whose progress, failures and
  // heartbeat it shares; none for the world's own.
  std::shared_ptr<state> world;

  state() = default;
  state(const state&) = delete;
  state& operator=(const state&) = delete;
  // A failed job's store stays while the other ranks read why (store_hold.hpp).
  ~state() {
    if (world || !store || !failures->failed()) return;
    if (!env.hosts_store()) {
      release_store(*store, env.rank);
      return;
    }
    failures->break_connections();
    hold_store_for_peers(*store, env.rank, env.world_size);
  }
};

runtime runtime::from_env() { return runtime(parse_launch_env()); }

runtime runtime::single_process() {
  launch_env env;
  env.device = device_request{};  // the CPU
  return runtime(env);
}

namespace {

// c10's errors carry a C++ backtrace in what() (c10d's warnings print it, fifteen "frame #N" lines
// after their own), which a user reading loom's sentence has no use for: as in PyTorch, the frames
// are left out unless TORCH_SHOW_CPP_STACKTRACES=1 asks for them. c10 keeps the choice for the
// process; each runtime makes it anew from its environment.
void choose_cpp_stack_traces(const launch_env& env) {
  if (env.show_cpp_stack_traces) {
    c10::SetStackTraceFetcher([]() -> c10::Backtrace { return c10::get_lazy_backtrace(/*frames_to_skip=*/1); });
  } else {
    c10::SetStackTraceFetcher([]() -> std::string { return {}; });
  }
}

}  // namespace

namespace {

// What a process group is to loom: c10d's group, for components such as the Reducer, and loom's collectives.
struct joined_group {
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  std::unique_ptr<collectives> comm;
  std::unique_ptr<collectives> host_comm;  // when comm's backend is not Gloo
};

// The process group of `env`'s rank and world size, meeting through `store`: Gloo for host tensors,
// NCCL for the device's under NCCL, and loom's collectives over them, which tell `progress` of
// their waits and name `group` for the hang check (its default: the world).
joined_group join_process_group(const c10::intrusive_ptr<c10d::Store>& store, const launch_env& env,
                                backend_kind backend, c10::Device device, job_progress& progress,
                                job_failures& failures, const std::string& name, collective_group group) {
  joined_group joined;
  joined.group = c10::make_intrusive<c10d::ProcessGroup>(store, env.rank, env.world_size);
  c10::intrusive_ptr<c10d::Backend> device_backend;
  c10::intrusive_ptr<c10d::Backend> gloo;
  try {
    gloo = make_gloo(store, env, env.rank, env.world_size, failures);
    joined.group->setBackend(c10::kCPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
    // Gloo over CUDA tensors (several ranks sharing a GPU): the Reducer's buckets go to Gloo too.
    if (device.is_cuda()) joined.group->setBackend(c10::kCUDA, c10d::ProcessGroup::BackendType::GLOO, gloo);
    device_backend = gloo;
#ifdef LOOM_HAVE_NCCL
    if (backend == backend_kind::nccl) {
      device_backend = make_nccl(store, env, env.rank, env.world_size, name, device, failures);
      joined.group->setBackend(c10::kCUDA, c10d::ProcessGroup::BackendType::NCCL, device_backend);
    }
#endif
  } catch (const std::exception& error) {
    throw_error<launch_error>("rank {} could not create the {} process group {} of {} ranks within {}: {}", env.rank,
                              to_string(backend), name, env.world_size, seconds(env.timeout), error_text(error));
  }
  joined.group->setDefaultBackend(backend == backend_kind::nccl ? c10d::ProcessGroup::BackendType::NCCL
                                                                : c10d::ProcessGroup::BackendType::GLOO);
  joined.group->setGroupName("loom." + name);
  // loom's own collectives take Gloo's CPU path for CUDA tensors: a copy each way, stated in docs/gpu.md.
  const bool staged = backend == backend_kind::gloo && device.is_cuda();
  if (backend == backend_kind::nccl) {
    collective_group host{group.world() ? std::string("host") : group.name + ".host",
                          group.world() ? all_ranks(env.world_size) : group.members};
    joined.host_comm = std::make_unique<collectives>(gloo, env.rank, env.world_size, /*stage_through_host=*/false,
                                                     &progress, std::move(host));
  }
  joined.comm =
      std::make_unique<collectives>(device_backend, env.rank, env.world_size, staged, &progress, std::move(group));
  return joined;
}

}  // namespace

runtime::runtime(const launch_env& env) : state_(std::make_shared<state>()) {
  choose_cpp_stack_traces(env);
  state& s = *state_;
  s.env = env;
  s.failures = std::make_unique<job_failures>(env.rank, env.error_file);
  s.device = choose_device(env);
  s.backend = choose_backend(env, s.device);
#ifdef LOOM_HAVE_NCCL
  if (s.device.is_cuda()) c10::cuda::set_device(s.device.index());  // NCCL's communicator binds to it
#endif
  if (!env.needs_process_group()) {
    s.comm = std::make_unique<collectives>(nullptr, 0, 1);
    return;
  }

  ignore_broken_pipes();
  s.store = rendezvous(env);
  joined_group joined = join_process_group(s.store, env, s.backend, s.device, s.progress, *s.failures, "world", {});
  s.group = std::move(joined.group);
  s.comm = std::move(joined.comm);
  s.host_comm = std::move(joined.host_comm);
  s.failures->watch(s.store, s.progress);
  s.pulse = std::make_unique<heartbeat>(s.store, env, s.device, s.progress, *s.failures);
}

int runtime::rank() const noexcept { return state_->env.rank; }
int runtime::local_rank() const noexcept { return state_->env.local_rank; }
int runtime::world_size() const noexcept { return state_->env.world_size; }
bool runtime::is_distributed() const noexcept { return state_->group != nullptr; }
backend_kind runtime::backend() const noexcept { return state_->backend; }
c10::Device runtime::device() const noexcept { return state_->device; }
std::chrono::milliseconds runtime::timeout() const noexcept { return state_->env.timeout; }
const launch_env& runtime::env() const noexcept { return state_->env; }
collectives& runtime::comm() const noexcept { return *state_->comm; }
collectives& runtime::host_comm() const noexcept { return state_->host_comm ? *state_->host_comm : *state_->comm; }
job_progress& runtime::progress() const noexcept { return state_->world ? state_->world->progress : state_->progress; }
job_failures& runtime::failures() const noexcept {
  return state_->world ? *state_->world->failures : *state_->failures;
}
const c10::intrusive_ptr<c10d::ProcessGroup>& runtime::process_group() const noexcept { return state_->group; }
const c10::intrusive_ptr<c10d::Store>& runtime::store() const noexcept { return state_->store; }

std::vector<int> runtime::silent_ranks(std::chrono::milliseconds window) const {
  const state& world = state_->world ? *state_->world : *state_;
  return world.pulse ? world.pulse->silent_ranks(window) : std::vector<int>{};
}

std::vector<std::pair<int, job_position>> runtime::departed_ranks() const {
  const state& world = state_->world ? *state_->world : *state_;
  return world.pulse ? world.pulse->departed_ranks() : std::vector<std::pair<int, job_position>>{};
}

runtime::runtime(std::shared_ptr<state> made) : state_(std::move(made)) {}

runtime runtime::among(const std::string& name, std::vector<int> members) const {
  const auto place = std::find(members.begin(), members.end(), rank());
  if (place == members.end() || !std::is_sorted(members.begin(), members.end())) {
    throw std::logic_error("runtime::among: give this rank's group, its world ranks ascending");
  }
  const std::int64_t generation = is_distributed() ? next_mesh_generation(*this) : 0;
  auto made = std::make_shared<state>();
  state& s = *made;
  s.world = state_->world ? state_->world : state_;
  s.env = state_->env;
  s.env.rank = static_cast<int>(place - members.begin());
  s.env.world_size = static_cast<int>(members.size());
  s.backend = state_->backend;
  s.device = state_->device;
  if (members.size() == 1) {
    s.comm = std::make_unique<collectives>(nullptr, 0, 1);
    return runtime(std::move(made));
  }
  s.store = c10::make_intrusive<c10d::PrefixStore>(fmt::format("loom/mesh.{}/{}", generation, name), state_->store);
  joined_group joined = join_process_group(s.store, s.env, s.backend, s.device, progress(), failures(), name,
                                           collective_group{name, std::move(members)});
  s.group = std::move(joined.group);
  s.comm = std::move(joined.comm);
  s.host_comm = std::move(joined.host_comm);
  return runtime(std::move(made));
}

}  // namespace loom

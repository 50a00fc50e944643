#pragma once
// c10d's backends as the runtime makes them (src/runtime/runtime.cpp), for the world and for the
// groups of a rank mesh (src/runtime/mesh.cpp): private to the runtime wing.

#include <loom/runtime/launch_env.hpp>

#include <c10/core/Device.h>
#include <c10/util/intrusive_ptr.h>

#include <string>

namespace c10d {
class Backend;
class Store;
}  // namespace c10d

namespace loom {

// A Gloo backend of `size` ranks, this one `rank`, meeting through `store` (a prefix of its own
// for each group), with the launcher's timeout and the network interface the world's uses.
c10::intrusive_ptr<c10d::Backend> make_gloo(const c10::intrusive_ptr<c10d::Store>& store, const launch_env& env,
                                            int rank, int size);
#ifdef LOOM_HAVE_NCCL
// A NCCL backend named `name` (its flight recorder's and watchdog's entries say which group), bound
// to `device`, its communicator made now, at build, rather than lazily by the first collective
// inside a step, on whichever thread issues it; nccl_environment's settings applied first.
c10::intrusive_ptr<c10d::Backend> make_nccl(const c10::intrusive_ptr<c10d::Store>& store, const launch_env& env,
                                            int rank, int size, const std::string& name, c10::Device device);
#endif

}  // namespace loom

#pragma once
// c10d's backends as the runtime makes them (src/runtime/runtime.cpp), for the world and for the
// groups of a rank mesh (src/runtime/mesh.cpp): private to the runtime wing.

#include <loom/runtime/launch_env.hpp>

#include <c10/core/Device.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace c10d {
class Backend;
class Store;
}  // namespace c10d

namespace loom {

class collectives;
class job_failures;
class runtime;

// A Gloo backend of `size` ranks, this one `rank`, meeting through `store` (a prefix of its own
// for each group), with the launcher's timeout and the network interface the world's uses; enlisted
// in `failures`, whose break_connections closes its connections (c10d's Gloo has no abort of its own).
c10::intrusive_ptr<c10d::Backend> make_gloo(const c10::intrusive_ptr<c10d::Store>& store, const launch_env& env,
                                            int rank, int size, job_failures& failures);
#ifdef LOOM_HAVE_NCCL
// A NCCL backend named `name` (its flight recorder's and watchdog's entries say which group), bound
// to `device`, its communicator made now, at build, rather than lazily by the first collective
// inside a step, on whichever thread issues it; nccl_environment's settings applied first. Enlisted
// in `failures`, whose break_connections aborts its communicators.
c10::intrusive_ptr<c10d::Backend> make_nccl(const c10::intrusive_ptr<c10d::Store>& store, const launch_env& env,
                                            int rank, int size, const std::string& name, c10::Device device,
                                            job_failures& failures);
#endif

// The groups of a mesh (src/runtime/mesh.cpp): a number for a new mesh's groups that no earlier
// mesh of the job used, and the collectives of the group `name` of `members` (world ranks, this one
// `rank` in it), whose backend its members make now, meeting through the store's prefix
// loom/mesh.<generation>/<name>. A group `on_host` carries host tensors through Gloo whatever the
// world's backend (what its members agree on without a read of the device).
[[nodiscard]] std::int64_t next_mesh_generation(const runtime& rt);
[[nodiscard]] std::unique_ptr<collectives> make_group(const runtime& rt, std::int64_t generation,
                                                      const std::string& name, std::vector<int> members, int rank,
                                                      bool on_host = false);

}  // namespace loom

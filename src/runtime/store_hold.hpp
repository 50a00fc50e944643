#pragma once
// A failed job's rendezvous store stays up until the ranks have read why: private to the runtime
// wing (src/runtime/failures.cpp implements it; the runtime's destruction and
// rethrow_as_job_failure use it). The rank that hosts the store (launch_env::hosts_store) ends its
// part by breaking its connections, so that every wait on it ends, and then waits, within a bound,
// for each other rank to release the store: a peer that finds its collective broken reads the
// published failure, or takes its roll call, there, and without the wait the host's quick exit
// would take the store from under it and leave it only "the store is unreachable" to say.

#include <chrono>

namespace c10d {
class Store;
}

namespace loom {

// How long the host waits for its peers at most: a peer's diagnosis takes the heartbeat's silence
// window, and a rank that died never releases the store.
inline constexpr std::chrono::seconds store_hold_bound{5};

// This rank, whose job failed, needs the store no more. Quiet when the store is gone.
void release_store(c10d::Store& store, int rank) noexcept;
// The host's wait: until every rank but `rank` of `world_size` has released the store, or
// `store_hold_bound` has passed.
void hold_store_for_peers(c10d::Store& store, int rank, int world_size) noexcept;

}  // namespace loom

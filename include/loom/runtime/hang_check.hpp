#pragma once
// The hang check: a rank that has waited on collectives for LOOM_HANG_CHECK_S (on the host, or with
// one unfinished on the device) looks at its peers' published progress (loom/runtime/progress.hpp)
// and stops the job when its wait can never end:
// - a peer published a failure and, a silence later, its exit has not broken the wait; or a peer
//   left the job (its program ended, its runtime was destroyed);
// - a peer's heartbeat stopped: it is stopped (SIGSTOP, a debugger) or died without a word;
// - it waits on one of loom's collectives and a peer of the collective's group is past that point
//   in the job (a later ordinal) without having joined it: had the peer issued it, it would be complete;
// - it and a peer both wait on their collective number n of the same group, and the two differ;
// - its oldest unfinished collective, number n of a group, is about to reach the transport's timeout,
//   and a live peer of the group has issued fewer than n over it: the peer is named, where the
//   transport (NCCL's watchdog, Gloo's timeout) would name only this rank's own operation.
// And without the store: once rank 0, which hosts it, is gone, a wait over a group with rank 0 in it
// that lasts a silence past the loss can never end (waits_on_lost_host), however the transport
// notices the death, or fails to.
// A peer that is merely slow (still computing, at or before this rank's point) never trips it before
// the transport's timeout would end the job, nor does a rank that computes for a long time: only
// waits are checked. docs/reliability.md.

#include <loom/runtime/progress.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

// What ranks that part ways have done, in every error that finds it.
inline constexpr std::string_view different_collectives =
    "the ranks issue different collectives (a loop that runs more passes on some ranks, or a collective in a "
    "branch that some ranks skip)";

// What a rank reads of a peer in the store.
struct peer_record {
  int rank = 0;
  std::optional<std::int64_t> beat;           // its heartbeat count, when it has published one
  std::optional<progress_snapshot> progress;  // its last published progress
  std::optional<job_position> left_at;        // set when it left the job on purpose, there
};

class hang_watch {
 public:
  using clock = std::chrono::steady_clock;

  // `after`: how long a wait lasts before this rank looks; `silence`: how long a peer's heartbeat
  // may stand still before it counts as stopped; `overdue`: how long a collective may stay
  // unfinished before a peer that has not issued it is named (just short of the transport's timeout,
  // which ends the wait anyway: a peer slower than that cannot finish the job).
  hang_watch(int rank, std::chrono::milliseconds after, std::chrono::milliseconds silence,
             std::chrono::milliseconds overdue);

  // Whether this rank has waited long enough to look at its peers.
  [[nodiscard]] bool due(const progress_snapshot& mine) const noexcept;

  // One look, at `now`, with the peers' records and the failure a rank published, if any. Returns
  // the job's error (without "loom: ") once the same reason has held at two looks in a row on the
  // same wait (or, for a peer that has not issued a collective, the same unfinished collective), so
  // that a collective completing just then is not taken for a hang.
  [[nodiscard]] std::optional<std::string> look(const progress_snapshot& mine, std::span<const peer_record> peers,
                                                const std::optional<std::string>& published, clock::time_point now);

  // The rendezvous store went unreachable at `lost_at`: rank 0, which hosts it, is gone. Whether this
  // rank's wait at `now` can never end: a wait, or an unfinished collective, over a group with rank 0
  // in it, lasting a silence past the loss (what rank 0 sent before it left arrives well within it).
  [[nodiscard]] bool waits_on_lost_host(const progress_snapshot& mine, clock::time_point lost_at,
                                        clock::time_point now) const noexcept;

  // This rank is not waiting (any more): forget what the looks saw.
  void reset() noexcept;
  // The peer that the error look() returned is about, when it names one (a peer that failed and
  // published it names itself in its own words).
  [[nodiscard]] std::optional<int> blamed() const noexcept;

 private:
  // Which rule found the wait hopeless, about which peer, and the error that says so.
  struct finding {
    enum class rule { peer_failed, peer_left, peer_past, peer_differs, peer_silent, peer_not_issued } why;
    int peer;
    std::string error;
  };
  [[nodiscard]] std::optional<finding> reason(const progress_snapshot& mine, std::span<const peer_record> peers,
                                              const std::optional<std::string>& published, clock::time_point now) const;

  struct beat_seen {
    std::optional<std::int64_t> beat;
    clock::time_point since;
  };
  int rank_;
  std::chrono::milliseconds after_;
  std::chrono::milliseconds silence_;
  std::chrono::milliseconds overdue_;
  std::vector<std::optional<beat_seen>> beats_;                     // by rank, while this rank waits
  std::optional<clock::time_point> published_since_;                // when a look first found a published failure
  std::optional<std::pair<progress_snapshot, finding>> suspected_;  // this rank, and what the last look found
};

}  // namespace loom

#pragma once
// Where this rank is in its job, for the hang check (loom/runtime/hang_check.hpp): the training
// thread marks the parts of each pass, each of loom's collectives it issues and each wait on one (a
// few stores under an uncontended lock, nothing sent), and the heartbeat thread publishes a snapshot
// with every beat.

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace c10d {
class Work;
}

namespace loom {

// A pass is one job.forward call and the job.backward that follows it; `between` is everything
// outside them (the optimizer, a training loop's own collectives, saves, setup).
enum class pass_part : std::uint8_t { forward, backward, between };

struct job_position {
  std::int64_t pass = 0;  // job.forward calls so far
  pass_part part = pass_part::between;
  // Entries into and exits from parts that communicate (a forward or backward with collectives in
  // the schedule): ranks that issue the same collectives pass the same ordinals, even when one of
  // them runs extra passes that communicate nothing (an evaluation on rank 0 alone under ddp()).
  std::int64_t ordinal = 0;

  // "the forward of pass 3", "the backward of pass 3", "after pass 3", "before the first pass"
  [[nodiscard]] std::string to_string() const;
  friend bool operator==(const job_position&, const job_position&) = default;
};

// The ranks a collective is issued over: every rank of the job (the world), or a group of them
// (hybrid sharding's shard and replicate groups, loom/runtime/mesh.hpp), by name and members.
struct collective_group {
  std::string name;          // empty: the world
  std::vector<int> members;  // by world rank, ascending; empty: the world

  [[nodiscard]] bool world() const noexcept { return members.empty(); }
  [[nodiscard]] bool includes(int rank) const noexcept;
  friend bool operator==(const collective_group&, const collective_group&) = default;
};

// One of loom's collectives as a rank issued it: its number in its group's order of issue, what it is
// ("reduce_scatter Float[64]") and the group.
struct issued_collective {
  std::int64_t number = 0;
  std::string what;
  collective_group group;

  // "collective #812, reduce_scatter Float[64] over shard.1"
  [[nodiscard]] std::string to_string() const;
  friend bool operator==(const issued_collective&, const issued_collective&) = default;
};

// How many collectives a rank has issued over one of its groups.
struct group_issue_count {
  collective_group group;
  std::int64_t issued = 0;

  friend bool operator==(const group_issue_count&, const group_issue_count&) = default;
};

enum class wait_kind : std::uint8_t {
  none,
  collective,  // in the wait of one of loom's own collectives
  part,        // in a forward or backward whose collectives the strategy waits on inside it (ddp's Reducer)
  host_read,   // reading a device tensor on the host: blocked until the device has run every collective
               // issued before it (NCCL's wait returns at once; this is where the host stops), the last of
               // which the snapshot names
};

struct progress_snapshot {
  job_position at;
  wait_kind waiting = wait_kind::none;
  std::chrono::milliseconds waited{0};
  std::int64_t collective = 0;  // the collective waited on: its number in its group's order of issue
                                // (a host read: the last one issued; 0 when none was)
  std::string what;             // "all_reduce Float[1]", or the part's collectives
  collective_group group;       // the collective's

  // The oldest collective this rank issued that is not complete yet, and how long ago it was issued.
  // Under NCCL the host does not wait (a wait() returns at once and the device waits), so a collective
  // that a peer never joins shows here, and in no wait.
  std::optional<issued_collective> unfinished{};
  std::chrono::milliseconds unfinished_for{0};
  // How many collectives this rank has issued over each of its groups: a peer waiting on collective
  // number n of a group learns here whether this rank has issued it.
  std::vector<group_issue_count> issued{};

  // The number of collectives issued over `over` (0 when none was).
  [[nodiscard]] std::int64_t issued_over(const collective_group& over) const noexcept;
  // Waiting on the host, or with a collective unfinished on the device: the rank awaits its peers.
  [[nodiscard]] bool awaits_peers() const noexcept { return waiting != wait_kind::none || unfinished.has_value(); }

  // "all_reduce Float[1] after pass 3", "reduce_scatter Float[8] over shard.1 in the backward of pass 2",
  // "a host read after all_reduce Float[2] in the backward of pass 2"
  [[nodiscard]] std::string where() const;
  friend bool operator==(const progress_snapshot&, const progress_snapshot&) = default;
};

// The heartbeat's record in the store: its beat count and the snapshot, on three lines (the position
// and the wait; the oldest unfinished collective; the count issued over each group).
[[nodiscard]] std::string encode_progress(std::int64_t beat, const progress_snapshot& snapshot);
// Nothing when `text` is not such a record.
[[nodiscard]] std::optional<std::pair<std::int64_t, progress_snapshot>> decode_progress(std::string_view text);
// A position alone, as a rank that leaves records it.
[[nodiscard]] std::string encode_position(const job_position& at);
[[nodiscard]] std::optional<job_position> decode_position(std::string_view text);

// How many times loom read a device tensor on the host (loom/runtime/host_reads.hpp), by the part of
// the pass the rank was in.
struct host_read_counts {
  std::int64_t forward = 0;
  std::int64_t backward = 0;
  std::int64_t between = 0;

  [[nodiscard]] std::int64_t total() const noexcept { return forward + backward + between; }
  friend bool operator==(const host_read_counts&, const host_read_counts&) = default;
};

class job_progress {
 public:
  using clock = std::chrono::steady_clock;

  job_progress();
  ~job_progress();
  job_progress(const job_progress&) = delete;
  job_progress& operator=(const job_progress&) = delete;

  // job.forward and job.backward: `communicates` when the strategy issues collectives in this part,
  // described by `collectives` ("the backward's all_reduce, schedule entries #0-#2").
  void enter(pass_part part, bool communicates, std::string collectives);
  // Back between passes, once the backward (or a forward that failed) is over.
  void leave_part();

  // A wait on collective number `number` of `group`, described by `what`, from construction to
  // destruction.
  class [[nodiscard]] wait_scope {
   public:
    wait_scope(job_progress* tracker, std::int64_t number, std::string what, collective_group group = {});
    ~wait_scope();
    wait_scope(const wait_scope&) = delete;
    wait_scope& operator=(const wait_scope&) = delete;

   private:
    job_progress* tracker_;
    std::optional<issued_collective> outer_;  // a wait this one is nested in
    clock::time_point outer_since_;
  };

  // `collective` was issued, as `work`: what a host read that follows waits on, and unfinished until
  // `work` reports itself complete (asked without blocking, at the next issue and at each snapshot:
  // under NCCL a wait() returns before the device has run the collective).
  void issued(issued_collective collective, c10::intrusive_ptr<c10d::Work> work);
  // The host's wait on `work` returned where the backend's wait blocks until the collective is done
  // (Gloo): finished, whatever the work says of itself (Gloo's reduce-scatter never says so), and
  // its tensors let go.
  void finished(const c10d::Work* work);

  // A read of a device tensor on the host, from construction to destruction: counted in its part of
  // the pass, and marked as a wait on the last collective issued.
  class [[nodiscard]] host_read_scope {
   public:
    explicit host_read_scope(job_progress& tracker);
    ~host_read_scope();
    host_read_scope(const host_read_scope&) = delete;
    host_read_scope& operator=(const host_read_scope&) = delete;

   private:
    job_progress& tracker_;
  };
  [[nodiscard]] host_read_counts host_reads() const;

  [[nodiscard]] progress_snapshot snapshot(clock::time_point now = clock::now()) const;

 private:
  struct in_flight {
    issued_collective collective;
    clock::time_point issued_at;
    c10::intrusive_ptr<c10d::Work> work;  // none once finished() was told

    [[nodiscard]] bool finished() const;
  };
  // Drops the finished ones before the last issued, under the lock.
  void drop_finished();

  mutable std::mutex mutex_;
  job_position at_;
  bool part_communicates_ = false;
  std::string part_collectives_;
  clock::time_point part_since_;
  std::optional<issued_collective> collective_;
  clock::time_point collective_since_;
  bool reading_ = false;  // collective_ is the last issued one, waited on by a host read
  // In order of issue, the last one issued always among them: the complete ones before it are
  // dropped at each issue, so that their works, and the tensors they hold, go as soon as the
  // training thread looks.
  std::deque<in_flight> in_flight_;
  std::vector<group_issue_count> issued_;
  host_read_counts host_reads_;
};

}  // namespace loom

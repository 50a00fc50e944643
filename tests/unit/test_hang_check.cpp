// The hang check's rules on made-up progress (loom/runtime/hang_check.hpp), and the progress record
// the heartbeat publishes. The same rules on real ranks: tests/dist/hang_check.py.
#include <loom/runtime/hang_check.hpp>
#include <loom/runtime/progress.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

using Catch::Matchers::ContainsSubstring;
using loom::hang_watch;
using loom::job_position;
using loom::pass_part;
using loom::peer_record;
using loom::progress_snapshot;
using loom::wait_kind;
using namespace std::chrono_literals;

namespace {

constexpr auto after = 5s;
constexpr auto silence = 2500ms;
const hang_watch::clock::time_point start{};

progress_snapshot waiting_on(std::int64_t collective, std::string what, job_position at,
                             std::chrono::milliseconds waited) {
  return {at, wait_kind::collective, waited, collective, std::move(what), {}};
}

progress_snapshot computing(job_position at) { return {at, wait_kind::none, 0ms, 0, {}, {}}; }

peer_record peer(int rank, std::int64_t beat, progress_snapshot progress) {
  return {rank, beat, std::move(progress), std::nullopt};
}

// Looks once a beat from `first` on, the peers' beats advancing unless `frozen`; returns the first
// error and the look that gave it (1-based), or nothing after `looks`.
struct outcome {
  std::optional<std::string> error;
  int look = 0;
};
outcome watch(hang_watch& watch, const progress_snapshot& mine, std::vector<peer_record> peers, int looks,
              bool frozen = false, const std::optional<std::string>& published = std::nullopt) {
  for (int look = 1; look <= looks; ++look) {
    progress_snapshot now_mine = mine;
    now_mine.waited += (look - 1) * 500ms;
    if (!frozen) {
      for (peer_record& p : peers) *p.beat += 1;
    }
    if (auto error = watch.look(now_mine, peers, published, start + after + (look - 1) * 500ms)) return {error, look};
  }
  return {};
}

}  // namespace

TEST_CASE("a progress record reads back as written", "[hang_check]") {
  const progress_snapshot snapshot = waiting_on(12, "all_gather Float[4, 8]", {3, pass_part::backward, 5}, 1234ms);
  const auto decoded = loom::decode_progress(loom::encode_progress(41, snapshot));
  REQUIRE(decoded);
  CHECK(decoded->first == 41);
  CHECK(decoded->second == snapshot);

  const progress_snapshot idle = computing({0, pass_part::between, 0});
  REQUIRE(loom::decode_progress(loom::encode_progress(0, idle)));
  CHECK(loom::decode_progress(loom::encode_progress(0, idle))->second == idle);

  progress_snapshot grouped = waiting_on(3, "reduce_scatter Float[2, 9]", {4, pass_part::backward, 8}, 77ms);
  grouped.group = {"shard.1", {2, 3}};
  CHECK(loom::encode_progress(5, grouped) == "5 4 1 8 1 77 3 shard.1=2,3 reduce_scatter Float[2, 9]");
  REQUIRE(loom::decode_progress(loom::encode_progress(5, grouped)));
  CHECK(loom::decode_progress(loom::encode_progress(5, grouped))->second == grouped);
  CHECK(grouped.where() == "reduce_scatter Float[2, 9] over shard.1 in the backward of pass 4");

  CHECK(loom::decode_position(loom::encode_position({7, pass_part::forward, 13})) ==
        job_position{7, pass_part::forward, 13});
  for (const char* bad :
       {"", "1 2", "1 2 9 0 0 0 0 *", "1 2 0 0 7 0 0 *", "x 1 1 1 1 1 1 *", "1  2 1 1 1 1 1 *", "1 2 0 0 0 0 0",
        "1 2 0 0 0 0 0 shard.0=", "1 2 0 0 0 0 0 =1", "1 2 0 0 0 0 0 s=1,", "1 2 0 0 0 0 0 s=1,x"}) {
    CAPTURE(bad);
    CHECK_FALSE(loom::decode_progress(bad));
  }
  CHECK_FALSE(loom::decode_position("1 2 3 4"));
  CHECK_FALSE(loom::decode_position("1 5 3"));
}

TEST_CASE("a rank's progress counts passes, and ordinals only where it communicates", "[hang_check]") {
  loom::job_progress progress;
  CHECK(progress.snapshot().at == job_position{0, pass_part::between, 0});
  CHECK(progress.snapshot().at.to_string() == "before the first pass");

  for (int pass = 1; pass <= 3; ++pass) {
    progress.enter(pass_part::forward, false, {});  // ddp's forward: no collectives
    CHECK(progress.snapshot().waiting == wait_kind::none);
    progress.leave_part();
    progress.enter(pass_part::backward, true, "schedule entries #0-#1: all_reduce");
    CHECK(progress.snapshot().waiting == wait_kind::part);
    CHECK(progress.snapshot().at.to_string() == "the backward of pass " + std::to_string(pass));
    progress.leave_part();
  }
  CHECK(progress.snapshot().at == job_position{3, pass_part::between, 6});
  CHECK(progress.snapshot().at.to_string() == "after pass 3");

  // An evaluation pass that communicates nothing moves the pass, not the ordinal.
  progress.enter(pass_part::forward, false, {});
  progress.leave_part();
  CHECK(progress.snapshot().at == job_position{4, pass_part::between, 6});

  const auto begun = loom::job_progress::clock::now();
  {
    const loom::job_progress::wait_scope outer(&progress, 7, "all_reduce Float[1]");
    {
      const loom::job_progress::wait_scope inner(&progress, 8, "broadcast Float[2]");
      CHECK(progress.snapshot().collective == 8);
    }
    const progress_snapshot snapshot = progress.snapshot(begun + 3s);
    CHECK(snapshot.waiting == wait_kind::collective);
    CHECK(snapshot.collective == 7);
    CHECK(snapshot.waited >= 2900ms);
    CHECK(snapshot.where() == "all_reduce Float[1] after pass 4");
  }
  CHECK(progress.snapshot().waiting == wait_kind::none);
  const loom::job_progress::wait_scope untracked(nullptr, 9, "barrier");  // a single process: no tracker
  CHECK(progress.snapshot().waiting == wait_kind::none);
}

TEST_CASE("a peer past this rank's wait trips the check, at the second look", "[hang_check]") {
  hang_watch check(0, after, silence);
  const auto mine = waiting_on(5, "all_gather Float[6]", {2, pass_part::between, 4}, after);
  CHECK_FALSE(check.due(waiting_on(5, "all_gather Float[6]", {2, pass_part::between, 4}, 4999ms)));
  CHECK(check.due(mine));
  const auto result = watch(check, mine, {peer(1, 10, computing({3, pass_part::backward, 5}))}, 10);
  REQUIRE(result.error);
  CHECK(result.look == 2);
  CHECK_THAT(*result.error, ContainsSubstring("it waited 5.5 s in all_gather Float[6] after pass 2") &&
                                ContainsSubstring("rank 1 has gone on to the backward of pass 3 without joining it"));
  CHECK(check.blamed() == 1);  // for loom-run's last line
}

TEST_CASE("peers that are only slow, or at the same point, never trip it", "[hang_check]") {
  hang_watch check(1, after, silence);
  const auto mine = waiting_on(9, "reduce_scatter Float[64]", {4, pass_part::backward, 7}, after);
  const auto result = watch(check, mine,
                            {peer(0, 3, computing({4, pass_part::forward, 6})),  // behind, computing
                             peer(2, 8, waiting_on(9, "reduce_scatter Float[64]", {4, pass_part::backward, 7}, 1s))},
                            40);
  CHECK_FALSE(result.error);
}

TEST_CASE("a wait that ends between two looks is not reported", "[hang_check]") {
  hang_watch check(0, after, silence);
  const std::vector<peer_record> peers{peer(1, 1, computing({3, pass_part::forward, 5}))};
  CHECK_FALSE(check.look(waiting_on(5, "all_reduce Float[1]", {2, pass_part::between, 4}, after), peers, {}, start));
  // The collective completed; the next look finds this rank in the next wait, with the peer past it too.
  CHECK_FALSE(
      check.look(waiting_on(6, "all_reduce Float[1]", {3, pass_part::forward, 5}, after), peers, {}, start + 500ms));
  check.reset();
  CHECK_FALSE(check.look(waiting_on(5, "all_reduce Float[1]", {2, pass_part::between, 4}, after), peers, {}, start));
}

TEST_CASE("a peer that left trips every kind of wait", "[hang_check]") {
  for (const wait_kind kind : {wait_kind::collective, wait_kind::part}) {
    hang_watch check(0, after, silence);
    progress_snapshot mine{{6, pass_part::backward, 11}, kind, after, 0, "schedule entries #0-#2: all_reduce", {}};
    peer_record gone = peer(2, 40, computing({6, pass_part::between, 12}));
    gone.left_at = job_position{6, pass_part::between, 12};
    const auto result = watch(check, mine, {peer(1, 3, computing({6, pass_part::backward, 11})), gone}, 4);
    REQUIRE(result.error);
    CHECK_THAT(*result.error, ContainsSubstring("rank 2 left the job after pass 6"));
  }
}

TEST_CASE("a silent peer trips it once the silence lasts", "[hang_check]") {
  hang_watch check(2, after, silence);
  const progress_snapshot mine{
      {3, pass_part::backward, 5}, wait_kind::part, after, 0, "schedule entry #0: all_reduce", {}};
  const auto result = watch(check, mine, {peer(0, 9, computing({3, pass_part::forward, 4}))}, 20, /*frozen=*/true);
  REQUIRE(result.error);
  CHECK(result.look >= 6);  // 2.5 s of silence, seen at 500 ms looks, then confirmed
  CHECK_THAT(*result.error, ContainsSubstring("in the backward of pass 3 (schedule entry #0: all_reduce)") &&
                                ContainsSubstring("rank 0 has sent no heartbeat for") &&
                                ContainsSubstring("its last beat: the forward of pass 3") &&
                                ContainsSubstring("SIGSTOP"));
  CHECK(check.blamed() == 0);
  hang_watch beating(2, after, silence);
  CHECK_FALSE(watch(beating, mine, {peer(0, 9, computing({3, pass_part::forward, 4}))}, 20).error);
}

TEST_CASE("inside a part, a peer further on does not trip it: the wait is not known to be a collective's",
          "[hang_check]") {
  hang_watch check(0, after, silence);
  const progress_snapshot mine{
      {3, pass_part::backward, 5}, wait_kind::part, after, 0, "schedule entry #0: all_reduce", {}};
  CHECK_FALSE(watch(check, mine, {peer(1, 1, computing({4, pass_part::forward, 7}))}, 20).error);
}

TEST_CASE("two ranks waiting on different collectives of the same number trip it", "[hang_check]") {
  hang_watch check(0, after, silence);
  const auto mine = waiting_on(12, "all_reduce Float[1]", {2, pass_part::between, 4}, after);
  const auto result = watch(check, mine, {peer(1, 5, waiting_on(12, "barrier", {2, pass_part::between, 4}, after))}, 4);
  REQUIRE(result.error);
  CHECK_THAT(*result.error,
             ContainsSubstring("(its collective #12), but rank 1's collective #12 is barrier after pass 2"));
}

TEST_CASE("a wait in a group is judged by the group's members alone", "[hang_check]") {
  // Hybrid sharding, 4 ranks: rank 0 waits on its shard group {0, 1}, whose rank 1 is still computing.
  hang_watch check(0, after, silence);
  progress_snapshot mine = waiting_on(6, "all_gather Float[2, 40]", {3, pass_part::forward, 5}, after);
  mine.group = {"shard.0", {0, 1}};
  progress_snapshot other_group = waiting_on(6, "reduce_scatter Float[2, 40]", {3, pass_part::backward, 6}, after);
  other_group.group = {"shard.1", {2, 3}};
  // The other shard group is past rank 0, and waits on its own collective #6: neither concerns rank 0.
  CHECK_FALSE(watch(check, mine,
                    {peer(1, 2, computing({3, pass_part::forward, 5})), peer(2, 7, other_group),
                     peer(3, 7, computing({3, pass_part::backward, 6}))},
                    20)
                  .error);
  // A member past it still trips it, named.
  hang_watch member(0, after, silence);
  const auto result =
      watch(member, mine, {peer(1, 2, computing({3, pass_part::backward, 6})), peer(2, 7, other_group)}, 4);
  REQUIRE(result.error);
  CHECK_THAT(*result.error, ContainsSubstring("in all_gather Float[2, 40] over shard.0 in the forward of pass 3") &&
                                ContainsSubstring("rank 1 has gone on to the backward of pass 3 without joining it"));
  // A member waiting on another collective of the group's number #6 trips it; of another group's, not.
  hang_watch differs(0, after, silence);
  progress_snapshot same_group = waiting_on(6, "barrier", {3, pass_part::forward, 5}, after);
  same_group.group = mine.group;
  CHECK(watch(differs, mine, {peer(1, 2, same_group)}, 4).error);
  hang_watch elsewhere(0, after, silence);
  progress_snapshot replicate = waiting_on(6, "all_reduce Float[40]", {3, pass_part::forward, 5}, after);
  replicate.group = {"replicate.1", {1, 3}};
  CHECK_FALSE(watch(elsewhere, mine, {peer(1, 2, replicate)}, 20).error);
}

TEST_CASE("a failure a peer published trips it, quoted, once the failed rank had a silence to exit", "[hang_check]") {
  hang_watch check(1, after, silence);
  // A rank that is merely past this one would trip it at once: the failure takes precedence, and waits.
  const auto result =
      watch(check, waiting_on(3, "broadcast Float[8]", {0, pass_part::between, 0}, after),
            {peer(0, 2, computing({1, pass_part::forward, 1}))}, 10, false, std::string("rank 0 failed: bad batch"));
  REQUIRE(result.error);
  CHECK(result.look == 7);  // the first look at 0 s, the silence at 2.5 s, confirmed at 3 s
  CHECK_THAT(*result.error, ContainsSubstring("before the first pass, and rank 0 failed: bad batch"));
  CHECK_FALSE(check.blamed());  // the failed rank names itself, first
}

TEST_CASE("a host read is counted in its part and waits on the last collective issued", "[hang_check][host_read]") {
  loom::job_progress progress;
  progress.enter(pass_part::forward, true, {});
  progress.issued(4, "all_gather Float[2, 40]", {"shard.0", {0, 1}});
  {
    const loom::job_progress::host_read_scope reading(progress);
    const progress_snapshot snapshot = progress.snapshot();
    CHECK(snapshot.waiting == wait_kind::host_read);
    CHECK(snapshot.collective == 4);
    CHECK(snapshot.where() == "a host read after all_gather Float[2, 40] over shard.0 in the forward of pass 1");
    const auto decoded = loom::decode_progress(loom::encode_progress(3, snapshot));
    REQUIRE(decoded);
    CHECK(decoded->second == snapshot);
  }
  CHECK(progress.snapshot().waiting == wait_kind::part);  // back in the forward, which communicates
  progress.leave_part();
  progress.enter(pass_part::backward, true, {});
  { const loom::job_progress::host_read_scope reading(progress); }
  progress.leave_part();
  {
    // Inside a collective's wait, the wait already names what the rank is blocked on.
    const loom::job_progress::wait_scope waiting(&progress, 9, "barrier");
    const loom::job_progress::host_read_scope reading(progress);
    CHECK(progress.snapshot().waiting == wait_kind::collective);
    CHECK(progress.snapshot().collective == 9);
  }
  { const loom::job_progress::host_read_scope reading(progress); }
  CHECK(progress.host_reads() == loom::host_read_counts{.forward = 1, .backward = 1, .between = 2});
  CHECK(progress.host_reads().total() == 4);
}

TEST_CASE("a rank blocked in a host read after a collective a peer has gone past trips the check",
          "[hang_check][host_read]") {
  // NCCL: rank 0's wait on the reduce-scatter returned at once; it blocks in the loss's read after the
  // step, which waits for every collective issued before it.
  hang_watch check(0, after, silence);
  progress_snapshot mine = waiting_on(7, "reduce_scatter Float[64]", {3, pass_part::between, 6}, after);
  mine.waiting = wait_kind::host_read;
  const auto result = watch(check, mine, {peer(1, 4, computing({4, pass_part::forward, 7}))}, 10);
  REQUIRE(result.error);
  CHECK(result.look == 2);
  CHECK_THAT(*result.error, ContainsSubstring("in a host read after reduce_scatter Float[64] after pass 3") &&
                                ContainsSubstring("rank 1 has gone on to the forward of pass 4 without joining it"));
  // A peer that waits on another collective of the same number trips it too.
  hang_watch differs(0, after, silence);
  CHECK(watch(differs, mine, {peer(1, 4, waiting_on(7, "all_gather Float[64]", {3, pass_part::between, 6}, after))}, 4)
            .error);
  // A peer still at the same point, slow, does not.
  hang_watch slow(0, after, silence);
  CHECK_FALSE(watch(slow, mine, {peer(1, 4, computing({3, pass_part::backward, 5}))}, 20).error);
  // A read before any collective waits on none: a peer further on is not known to be a hang, and a
  // stopped one is still named by its silence.
  hang_watch before_any(0, after, silence);
  progress_snapshot first = computing({1, pass_part::forward, 1});
  first.waiting = wait_kind::host_read;
  first.waited = after;
  CHECK_FALSE(watch(before_any, first, {peer(1, 4, computing({2, pass_part::forward, 3}))}, 20).error);
  hang_watch stopped(0, after, silence);
  const auto silent = watch(stopped, first, {peer(1, 4, computing({1, pass_part::forward, 1}))}, 20, /*frozen=*/true);
  REQUIRE(silent.error);
  CHECK_THAT(*silent.error, ContainsSubstring("a host read in the forward of pass 1") &&
                                ContainsSubstring("rank 1 has sent no heartbeat"));
}

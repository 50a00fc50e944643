// The hang check's rules on made-up progress (loom/runtime/hang_check.hpp), and the progress record
// the heartbeat publishes. The same rules on real ranks: tests/dist/hang_check.py and
// tests/dist/skipped_collective.py.
#include <loom/runtime/hang_check.hpp>
#include <loom/runtime/progress.hpp>

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

using Catch::Matchers::ContainsSubstring;
using loom::collective_group;
using loom::hang_watch;
using loom::issued_collective;
using loom::job_position;
using loom::pass_part;
using loom::peer_record;
using loom::progress_snapshot;
using loom::wait_kind;
using namespace std::chrono_literals;

namespace {

constexpr auto after = 5s;
constexpr auto silence = 2500ms;
constexpr auto overdue = 17500ms;  // a 20 s transport timeout, less the heartbeat's lead
const hang_watch::clock::time_point start{};

// A collective's work whose completion the test decides, as NCCL's reports its event's.
struct test_work final : c10d::Work {
  bool isCompleted() override { return done; }
  bool done = false;
};

progress_snapshot waiting_on(std::int64_t collective, std::string what, job_position at,
                             std::chrono::milliseconds waited) {
  return {at, wait_kind::collective, waited, collective, std::move(what), {}};
}

progress_snapshot computing(job_position at) { return {at, wait_kind::none, 0ms, 0, {}, {}}; }

// `snapshot` with `collective` issued `ago` and not complete, the last of its group's issued.
progress_snapshot with_unfinished(progress_snapshot snapshot, issued_collective collective,
                                  std::chrono::milliseconds ago) {
  snapshot.issued.push_back({collective.group, collective.number});
  snapshot.unfinished = std::move(collective);
  snapshot.unfinished_for = ago;
  return snapshot;
}

// `snapshot` with `count` collectives issued over `group`.
progress_snapshot with_issued(progress_snapshot snapshot, collective_group group, std::int64_t count) {
  snapshot.issued.push_back({std::move(group), count});
  return snapshot;
}

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
    if (now_mine.unfinished) now_mine.unfinished_for += (look - 1) * 500ms;
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
  grouped = with_issued(with_unfinished(grouped, {2, "all_gather Float[2, 9]", grouped.group}, 1500ms), {}, 7);
  CHECK(loom::encode_progress(5, grouped) ==
        "5 4 1 8 1 77 3 shard.1=2,3 reduce_scatter Float[2, 9]\n"
        "2 1500 shard.1=2,3 all_gather Float[2, 9]\n"
        "shard.1=2,3:2 *:7");
  REQUIRE(loom::decode_progress(loom::encode_progress(5, grouped)));
  CHECK(loom::decode_progress(loom::encode_progress(5, grouped))->second == grouped);
  CHECK(grouped.where() == "reduce_scatter Float[2, 9] over shard.1 in the backward of pass 4");
  CHECK(grouped.unfinished->to_string() == "collective #2, all_gather Float[2, 9] over shard.1");
  CHECK(grouped.issued_over({"shard.1", {2, 3}}) == 2);
  CHECK(grouped.issued_over({}) == 7);
  CHECK(grouped.issued_over({"shard.0", {0, 1}}) == 0);

  CHECK(loom::decode_position(loom::encode_position({7, pass_part::forward, 13})) ==
        job_position{7, pass_part::forward, 13});
  const std::string nothing_unfinished = "\n0 0 * \n";
  for (const std::string bad :
       {"", "1 2", "1 2 9 0 0 0 0 *", "1 2 0 0 7 0 0 *", "x 1 1 1 1 1 1 *", "1  2 1 1 1 1 1 *", "1 2 0 0 0 0 0",
        "1 2 0 0 0 0 0 shard.0=", "1 2 0 0 0 0 0 =1", "1 2 0 0 0 0 0 s=1,", "1 2 0 0 0 0 0 s=1,x"}) {
    for (const std::string& record : {bad, bad + nothing_unfinished}) {
      CAPTURE(record);
      CHECK_FALSE(loom::decode_progress(record));
    }
  }
  const std::string position = "1 2 0 0 0 0 0 *";
  REQUIRE(loom::decode_progress(position + nothing_unfinished));
  CHECK_FALSE(loom::decode_progress(position + nothing_unfinished)->second.unfinished);
  for (const char* bad : {"", "\n0 0 *", "\n-1 0 * \n", "\n1 0\n", "\n1 0 s= x\n", "\n0 0 * \nshard.1=2",
                          "\n0 0 * \ns=2:x", "\n0 0 * \n:1", "\n0 0 * \n*:1\nx"}) {
    CAPTURE(bad);
    CHECK_FALSE(loom::decode_progress(position + bad));
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
  hang_watch check(0, after, silence, overdue);
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
  hang_watch check(1, after, silence, overdue);
  const auto mine = waiting_on(9, "reduce_scatter Float[64]", {4, pass_part::backward, 7}, after);
  const auto result = watch(check, mine,
                            {peer(0, 3, computing({4, pass_part::forward, 6})),  // behind, computing
                             peer(2, 8, waiting_on(9, "reduce_scatter Float[64]", {4, pass_part::backward, 7}, 1s))},
                            40);
  CHECK_FALSE(result.error);
}

TEST_CASE("a wait that ends between two looks is not reported", "[hang_check]") {
  hang_watch check(0, after, silence, overdue);
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
    hang_watch check(0, after, silence, overdue);
    progress_snapshot mine{{6, pass_part::backward, 11}, kind, after, 0, "schedule entries #0-#2: all_reduce", {}};
    peer_record gone = peer(2, 40, computing({6, pass_part::between, 12}));
    gone.left_at = job_position{6, pass_part::between, 12};
    const auto result = watch(check, mine, {peer(1, 3, computing({6, pass_part::backward, 11})), gone}, 4);
    REQUIRE(result.error);
    CHECK_THAT(*result.error, ContainsSubstring("rank 2 left the job after pass 6"));
  }
}

TEST_CASE("a silent peer trips it once the silence lasts", "[hang_check]") {
  hang_watch check(2, after, silence, overdue);
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
  hang_watch beating(2, after, silence, overdue);
  CHECK_FALSE(watch(beating, mine, {peer(0, 9, computing({3, pass_part::forward, 4}))}, 20).error);
}

TEST_CASE("inside a part, a peer further on does not trip it: the wait is not known to be a collective's",
          "[hang_check]") {
  hang_watch check(0, after, silence, overdue);
  const progress_snapshot mine{
      {3, pass_part::backward, 5}, wait_kind::part, after, 0, "schedule entry #0: all_reduce", {}};
  CHECK_FALSE(watch(check, mine, {peer(1, 1, computing({4, pass_part::forward, 7}))}, 20).error);
}

TEST_CASE("two ranks waiting on different collectives of the same number trip it", "[hang_check]") {
  hang_watch check(0, after, silence, overdue);
  const auto mine = waiting_on(12, "all_reduce Float[1]", {2, pass_part::between, 4}, after);
  const auto result = watch(check, mine, {peer(1, 5, waiting_on(12, "barrier", {2, pass_part::between, 4}, after))}, 4);
  REQUIRE(result.error);
  CHECK_THAT(*result.error,
             ContainsSubstring("(its collective #12), but rank 1's collective #12 is barrier after pass 2"));
}

TEST_CASE("a wait in a group is judged by the group's members alone", "[hang_check]") {
  // Hybrid sharding, 4 ranks: rank 0 waits on its shard group {0, 1}, whose rank 1 is still computing.
  hang_watch check(0, after, silence, overdue);
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
  hang_watch member(0, after, silence, overdue);
  const auto result =
      watch(member, mine, {peer(1, 2, computing({3, pass_part::backward, 6})), peer(2, 7, other_group)}, 4);
  REQUIRE(result.error);
  CHECK_THAT(*result.error, ContainsSubstring("in all_gather Float[2, 40] over shard.0 in the forward of pass 3") &&
                                ContainsSubstring("rank 1 has gone on to the backward of pass 3 without joining it"));
  // A member waiting on another collective of the group's number #6 trips it; of another group's, not.
  hang_watch differs(0, after, silence, overdue);
  progress_snapshot same_group = waiting_on(6, "barrier", {3, pass_part::forward, 5}, after);
  same_group.group = mine.group;
  CHECK(watch(differs, mine, {peer(1, 2, same_group)}, 4).error);
  hang_watch elsewhere(0, after, silence, overdue);
  progress_snapshot replicate = waiting_on(6, "all_reduce Float[40]", {3, pass_part::forward, 5}, after);
  replicate.group = {"replicate.1", {1, 3}};
  CHECK_FALSE(watch(elsewhere, mine, {peer(1, 2, replicate)}, 20).error);
}

TEST_CASE("without the store, a wait on rank 0 ends a silence after the loss", "[hang_check]") {
  const hang_watch check(1, after, silence, overdue);
  const auto lost = hang_watch::clock::time_point{} + 1h;
  const progress_snapshot world_wait = waiting_on(4, "all_reduce Float[8]", {2, pass_part::backward, 4}, 1s);
  CHECK_FALSE(check.waits_on_lost_host(world_wait, lost, lost + silence - 1ms));
  CHECK(check.waits_on_lost_host(world_wait, lost, lost + silence));
  // Computing, or waiting in a group without rank 0, is not hopeless: the job may still end well.
  CHECK_FALSE(check.waits_on_lost_host(computing({2, pass_part::backward, 4}), lost, lost + 1min));
  progress_snapshot replicate = world_wait;
  replicate.group = {"replicate.1", {1, 3}};
  CHECK_FALSE(check.waits_on_lost_host(replicate, lost, lost + 1min));
  replicate.group = {"replicate.0", {0, 1}};
  CHECK(check.waits_on_lost_host(replicate, lost, lost + 1min));
  // Under NCCL the host does not wait: an unfinished collective over the world is the wait.
  const progress_snapshot device_wait =
      with_unfinished(computing({2, pass_part::backward, 4}), {4, "all_reduce Float[8]", {}}, 3s);
  CHECK(check.waits_on_lost_host(device_wait, lost, lost + silence));
  // Rank 0 does not wait on itself.
  CHECK_FALSE(hang_watch(0, after, silence, overdue).waits_on_lost_host(world_wait, lost, lost + 1min));
}

TEST_CASE("a failure a peer published trips it, quoted, once the failed rank had a silence to exit", "[hang_check]") {
  hang_watch check(1, after, silence, overdue);
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
  progress.issued({4, "all_gather Float[2, 40]", {"shard.0", {0, 1}}}, c10::make_intrusive<test_work>());
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
  hang_watch check(0, after, silence, overdue);
  progress_snapshot mine = waiting_on(7, "reduce_scatter Float[64]", {3, pass_part::between, 6}, after);
  mine.waiting = wait_kind::host_read;
  const auto result = watch(check, mine, {peer(1, 4, computing({4, pass_part::forward, 7}))}, 10);
  REQUIRE(result.error);
  CHECK(result.look == 2);
  CHECK_THAT(*result.error, ContainsSubstring("in a host read after reduce_scatter Float[64] after pass 3") &&
                                ContainsSubstring("rank 1 has gone on to the forward of pass 4 without joining it"));
  // A peer that waits on another collective of the same number trips it too.
  hang_watch differs(0, after, silence, overdue);
  CHECK(watch(differs, mine, {peer(1, 4, waiting_on(7, "all_gather Float[64]", {3, pass_part::between, 6}, after))}, 4)
            .error);
  // A peer still at the same point, slow, does not.
  hang_watch slow(0, after, silence, overdue);
  CHECK_FALSE(watch(slow, mine, {peer(1, 4, computing({3, pass_part::backward, 5}))}, 20).error);
  // A read before any collective waits on none: a peer further on is not known to be a hang, and a
  // stopped one is still named by its silence.
  hang_watch before_any(0, after, silence, overdue);
  progress_snapshot first = computing({1, pass_part::forward, 1});
  first.waiting = wait_kind::host_read;
  first.waited = after;
  CHECK_FALSE(watch(before_any, first, {peer(1, 4, computing({2, pass_part::forward, 3}))}, 20).error);
  hang_watch stopped(0, after, silence, overdue);
  const auto silent = watch(stopped, first, {peer(1, 4, computing({1, pass_part::forward, 1}))}, 20, /*frozen=*/true);
  REQUIRE(silent.error);
  CHECK_THAT(*silent.error, ContainsSubstring("a host read in the forward of pass 1") &&
                                ContainsSubstring("rank 1 has sent no heartbeat"));
}

TEST_CASE("a collective stays unfinished until its work reports it complete, and counts in its group",
          "[hang_check][unfinished]") {
  // Under NCCL a wait() returns before the device has run the collective: only the work knows.
  loom::job_progress progress;
  const collective_group shard{"shard.0", {0, 1}};
  const auto gather = c10::make_intrusive<test_work>();
  const auto loss = c10::make_intrusive<test_work>();
  const auto scatter = c10::make_intrusive<test_work>();
  const auto begun = loom::job_progress::clock::now();
  progress.issued({1, "all_gather Float[2, 40]", shard}, gather);
  progress.issued({1, "all_reduce Float[1]", {}}, loss);
  progress.issued({2, "reduce_scatter Float[80]", shard}, scatter);

  progress_snapshot snapshot = progress.snapshot(begun + 3s);
  CHECK(snapshot.waiting == wait_kind::none);
  CHECK(snapshot.awaits_peers());
  CHECK(snapshot.unfinished == issued_collective{1, "all_gather Float[2, 40]", shard});
  CHECK(snapshot.unfinished_for >= 2900ms);
  CHECK(snapshot.issued_over(shard) == 2);
  CHECK(snapshot.issued_over({}) == 1);
  CHECK(snapshot.issued_over({"replicate.0", {0, 2}}) == 0);
  const auto decoded = loom::decode_progress(loom::encode_progress(9, snapshot));
  REQUIRE(decoded);
  CHECK(decoded->second == snapshot);

  gather->done = true;
  scatter->done = true;  // collectives of different groups complete in any order
  CHECK(progress.snapshot().unfinished == issued_collective{1, "all_reduce Float[1]", {}});
  loss->done = true;
  CHECK_FALSE(progress.snapshot().unfinished);
  CHECK_FALSE(progress.snapshot().awaits_peers());

  // The next issue lets the complete works go, and the tensors they hold with them.
  const auto barrier = c10::make_intrusive<test_work>();
  progress.issued({3, "barrier", shard}, barrier);
  CHECK(gather.use_count() == 1);
  CHECK(loss.use_count() == 1);
  CHECK(scatter.use_count() == 1);
  CHECK(progress.snapshot().unfinished == issued_collective{3, "barrier", shard});
  CHECK(progress.snapshot().issued_over(shard) == 3);
}

TEST_CASE("a live peer that has not issued the collective its group waits on is named, near the transport's timeout",
          "[hang_check][unfinished]") {
  // Eight ranks in shard groups of four; ranks 4-6 issued reduce-scatter #812 over shard.1, rank 7 is
  // still in its forward. Under NCCL none of them waits on the host: only the collective is unfinished.
  const collective_group shard1{"shard.1", {4, 5, 6, 7}};
  const issued_collective scatter{812, "reduce_scatter Float[64]", shard1};
  const auto issued_it = [&](job_position at) { return with_unfinished(computing(at), scatter, 1s); };
  const peer_record laggard = peer(7, 3, with_issued(computing({5, pass_part::forward, 9}), shard1, 811));
  const peer_record other_group =
      peer(0, 8, with_issued(computing({6, pass_part::forward, 11}), {"shard.0", {0, 1, 2, 3}}, 40));
  const std::vector<peer_record> peers{other_group, peer(5, 4, issued_it({5, pass_part::backward, 10})),
                                       peer(6, 2, issued_it({5, pass_part::backward, 10})), laggard};

  hang_watch check(4, after, silence, overdue);
  const progress_snapshot mine = with_unfinished(computing({5, pass_part::backward, 10}), scatter, overdue - 1s);
  CHECK(check.due(mine));  // an unfinished collective is a wait, though the host does not wait
  const auto result = watch(check, mine, peers, 10);
  REQUIRE(result.error);
  CHECK(result.look == 4);  // overdue at the third look, confirmed at the fourth: until then, a slow peer
  CHECK(*result.error ==
        "rank 7 has not issued collective #812, reduce_scatter Float[64] over shard.1, which ranks 4-6 wait on (rank 4 "
        "issued it 18 s ago; rank 7's last beat: the forward of pass 5): it is stuck outside loom's collectives, or " +
            std::string(loom::different_collectives));
  CHECK(check.blamed() == 7);

  // Under Gloo the host waits on it as well: the same finding.
  hang_watch gloo(4, after, silence, overdue);
  progress_snapshot waiting =
      with_unfinished(waiting_on(812, scatter.what, {5, pass_part::backward, 10}, overdue), scatter, overdue);
  waiting.group = shard1;
  const auto on_gloo = watch(gloo, waiting, peers, 10);
  REQUIRE(on_gloo.error);
  CHECK_THAT(*on_gloo.error, ContainsSubstring("rank 7 has not issued collective #812"));

  // Two that have not issued it are both named, the first blamed.
  hang_watch two(4, after, silence, overdue);
  const std::vector<peer_record> two_behind{peer(5, 4, issued_it({5, pass_part::backward, 10})),
                                            peer(6, 2, with_issued(computing({5, pass_part::forward, 9}), shard1, 790)),
                                            laggard};
  const auto both =
      watch(two, with_unfinished(computing({5, pass_part::backward, 10}), scatter, overdue), two_behind, 4);
  REQUIRE(both.error);
  CHECK_THAT(*both.error, ContainsSubstring("ranks 6 and 7 have not issued collective #812, reduce_scatter Float[64] "
                                            "over shard.1, which ranks 4 and 5 wait on (rank 4 issued it") &&
                              ContainsSubstring("rank 6's last beat: the forward of pass 5): they are stuck"));
  CHECK(two.blamed() == 6);
}

TEST_CASE("an unfinished collective that every member issued, or a peer outside its group, names nobody",
          "[hang_check][unfinished]") {
  const collective_group replicate{"replicate.0", {0, 2}};
  const issued_collective reduce{31, "all_reduce Float[40]", replicate};
  const progress_snapshot mine = with_unfinished(computing({3, pass_part::backward, 6}), reduce, overdue);
  // Rank 2 issued it, its device is slow; rank 1, outside the group, has issued nothing over it.
  hang_watch check(0, after, silence, overdue);
  CHECK_FALSE(watch(check, mine,
                    {peer(1, 5, computing({2, pass_part::forward, 3})),
                     peer(2, 5, with_issued(computing({3, pass_part::backward, 6}), replicate, 31))},
                    20)
                  .error);
  // A peer with no record yet is not known to be behind.
  hang_watch unknown(0, after, silence, overdue);
  CHECK_FALSE(watch(unknown, mine, {peer_record{2, 5, std::nullopt, std::nullopt}}, 20).error);
}

TEST_CASE("the finding holds while this rank's host goes on, but not once the collective completes",
          "[hang_check][unfinished]") {
  const collective_group world{};
  const issued_collective reduce{6, "all_reduce Float[4]", world};
  const std::vector<peer_record> peers{peer(1, 5, with_issued(computing({3, pass_part::between, 6}), world, 5))};
  hang_watch check(0, after, silence, overdue);
  // Under NCCL the host goes on into the next pass between two looks; the collective is the same.
  CHECK_FALSE(check.look(with_unfinished(computing({3, pass_part::between, 6}), reduce, overdue), peers, {}, start));
  const auto confirmed = check.look(with_unfinished(computing({4, pass_part::forward, 7}), reduce, overdue + 500ms),
                                    peers, {}, start + 500ms);
  REQUIRE(confirmed);
  CHECK_THAT(*confirmed, ContainsSubstring("rank 1 has not issued collective #6, all_reduce Float[4], which rank 0 "
                                           "waits on (rank 0 issued it 18 s ago"));
  // Had it completed in between, the next unfinished one is another subject.
  hang_watch completed(0, after, silence, overdue);
  CHECK_FALSE(
      completed.look(with_unfinished(computing({3, pass_part::between, 6}), reduce, overdue), peers, {}, start));
  const issued_collective next{7, "all_reduce Float[4]", world};
  CHECK_FALSE(
      completed.look(with_unfinished(computing({4, pass_part::forward, 7}), next, overdue), peers, {}, start + 500ms));
}

TEST_CASE("under NCCL a silent peer is named once a collective has been unfinished long enough",
          "[hang_check][unfinished]") {
  const issued_collective reduce{5, "all_reduce Float[4]", {}};
  hang_watch check(0, after, silence, overdue);
  CHECK_FALSE(check.due(with_unfinished(computing({2, pass_part::between, 4}), reduce, after - 1ms)));
  const progress_snapshot mine = with_unfinished(computing({2, pass_part::between, 4}), reduce, after);
  CHECK(check.due(mine));
  const auto result = watch(check, mine, {peer(1, 9, computing({2, pass_part::forward, 3}))}, 20, /*frozen=*/true);
  REQUIRE(result.error);
  CHECK_THAT(*result.error, ContainsSubstring("its collective #5, all_reduce Float[4] is not complete ") &&
                                ContainsSubstring(" s after it was issued (after pass 2), but rank 1 has sent no "
                                                  "heartbeat"));
}

#include <loom/runtime/hang_check.hpp>

#include <fmt/format.h>

#include <algorithm>

namespace loom {
namespace {

double seconds(std::chrono::milliseconds span) { return static_cast<double>(span.count()) / 1000.0; }

bool same_wait(const progress_snapshot& a, const progress_snapshot& b) {
  return a.at == b.at && a.waiting == b.waiting && a.collective == b.collective && a.what == b.what &&
         a.group == b.group && a.unfinished == b.unfinished;
}

// How this rank's error begins: its wait on the host or, where the host does not wait (NCCL), the
// oldest collective it issued that is not complete.
std::string waited_text(const progress_snapshot& mine) {
  if (mine.waiting != wait_kind::none || !mine.unfinished) {
    return fmt::format("it waited {:g} s in {}", seconds(mine.waited), mine.where());
  }
  return fmt::format("its {} is not complete {:g} s after it was issued ({})", mine.unfinished->to_string(),
                     seconds(mine.unfinished_for), mine.at.to_string());
}

// "rank 3", "ranks 0 and 2", "ranks 0-2", "ranks 0, 1 and 5-7": `ranks` ascending, runs of three or
// more as ranges.
std::string ranks_text(const std::vector<int>& ranks) {
  std::vector<std::string> parts;
  for (std::size_t first = 0; first < ranks.size();) {
    std::size_t last = first;
    while (last + 1 < ranks.size() && ranks[last + 1] == ranks[last] + 1) ++last;
    if (last - first >= 2) {
      parts.push_back(fmt::format("{}-{}", ranks[first], ranks[last]));
    } else {
      for (std::size_t i = first; i <= last; ++i) parts.push_back(std::to_string(ranks[i]));
    }
    first = last + 1;
  }
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < parts.size(); ++i) {
    text += (i == 0 ? "" : i + 1 == parts.size() ? " and " : ", ") + parts[i];
  }
  return text;
}

bool waits_on_collective(const progress_snapshot& snapshot) {
  return snapshot.waiting == wait_kind::collective ||
         (snapshot.waiting == wait_kind::host_read && snapshot.collective > 0);
}

}  // namespace

hang_watch::hang_watch(int rank, std::chrono::milliseconds after, std::chrono::milliseconds silence,
                       std::chrono::milliseconds overdue)
    : rank_(rank), after_(after), silence_(silence), overdue_(overdue) {}

bool hang_watch::due(const progress_snapshot& mine) const noexcept {
  return (mine.waiting != wait_kind::none && mine.waited >= after_) ||
         (mine.unfinished && mine.unfinished_for >= after_);
}

bool hang_watch::waits_on_lost_host(const progress_snapshot& mine, clock::time_point lost_at,
                                    clock::time_point now) const noexcept {
  constexpr int host = 0;
  const bool waits_on_host = (mine.waiting != wait_kind::none && mine.group.includes(host)) ||
                             (mine.unfinished && mine.unfinished->group.includes(host));
  return rank_ != host && waits_on_host && now - lost_at >= silence_;
}

void hang_watch::reset() noexcept {
  beats_.clear();
  published_since_.reset();
  suspected_.reset();
}

std::optional<int> hang_watch::blamed() const noexcept {
  if (!suspected_ || suspected_->second.peer < 0) return std::nullopt;
  return suspected_->second.peer;
}

std::optional<std::string> hang_watch::look(const progress_snapshot& mine, std::span<const peer_record> peers,
                                            const std::optional<std::string>& published, clock::time_point now) {
  for (const peer_record& peer : peers) {
    if (peer.rank >= static_cast<int>(beats_.size())) beats_.resize(static_cast<std::size_t>(peer.rank) + 1);
    std::optional<beat_seen>& seen = beats_[static_cast<std::size_t>(peer.rank)];
    if (!seen || seen->beat != peer.beat) seen = beat_seen{peer.beat, now};
  }
  if (published && !published_since_) published_since_ = now;
  auto found = reason(mine, peers, published, now);
  if (!found) {
    suspected_.reset();
    return std::nullopt;
  }
  // A peer that has not issued a collective is about the collective: under NCCL this rank's host
  // goes on meanwhile. Every other finding is about the wait.
  const bool same_subject = found->why == finding::rule::peer_not_issued
                                ? suspected_ && suspected_->first.unfinished == mine.unfinished
                                : suspected_ && same_wait(suspected_->first, mine);
  if (same_subject && suspected_->second.why == found->why && suspected_->second.peer == found->peer) {
    return std::move(found->error);
  }
  suspected_.emplace(mine, std::move(*found));
  return std::nullopt;
}

std::optional<hang_watch::finding> hang_watch::reason(const progress_snapshot& mine, std::span<const peer_record> peers,
                                                      const std::optional<std::string>& published,
                                                      clock::time_point now) const {
  using enum finding::rule;
  const std::string waited = waited_text(mine);
  if (published) {
    // The failed rank's exit breaks the wait, and the error then names it: give that a silence.
    if (now - *published_since_ < silence_) return std::nullopt;
    return finding{peer_failed, -1, fmt::format("{}, and {}", waited, *published)};
  }
  for (const peer_record& peer : peers) {
    if (peer.rank == rank_ || !peer.left_at) continue;
    return finding{peer_left, peer.rank,
                   fmt::format("{}, but rank {} left the job {} (its program ended, or its runtime was destroyed), so "
                               "the wait can never end: {}",
                               waited, peer.rank, peer.left_at->to_string(), different_collectives)};
  }
  // A host read under NCCL blocks on the collectives issued before it, the last of which it names.
  if (waits_on_collective(mine)) {
    // Only the members of the collective's group take part in it: a rank of another group may be
    // anywhere (hybrid sharding's other shard groups run ahead or behind), and its collectives are
    // numbered in its own groups.
    for (const peer_record& peer : peers) {
      if (peer.rank == rank_ || !peer.progress || !mine.group.includes(peer.rank)) continue;
      const progress_snapshot& theirs = *peer.progress;
      if (theirs.at.ordinal > mine.at.ordinal) {
        return finding{peer_past, peer.rank,
                       fmt::format("{}, but rank {} has gone on to {} without joining it: {}", waited, peer.rank,
                                   theirs.at.to_string(), different_collectives)};
      }
      if (waits_on_collective(theirs) && theirs.group == mine.group && theirs.collective == mine.collective &&
          theirs.what != mine.what) {
        return finding{
            peer_differs, peer.rank,
            fmt::format("{} (its collective #{}), but rank {}'s collective #{} is {}: {}", waited, mine.collective,
                        peer.rank, theirs.collective, theirs.where(), different_collectives)};
      }
    }
  }
  for (const peer_record& peer : peers) {
    if (peer.rank == rank_ || peer.rank >= static_cast<int>(beats_.size())) continue;
    const std::optional<beat_seen>& seen = beats_[static_cast<std::size_t>(peer.rank)];
    if (!seen) continue;
    const auto still = std::chrono::duration_cast<std::chrono::milliseconds>(now - seen->since);
    if (still < silence_) continue;
    return finding{
        peer_silent, peer.rank,
        fmt::format("{}, but rank {} has sent no heartbeat for {:g} s ({}): it is stopped (SIGSTOP, a "
                    "debugger) or died without a word",
                    waited, peer.rank, seconds(still),
                    peer.progress ? "its last beat: " + peer.progress->where() : std::string("it never sent one"))};
  }
  // A collective that a live member of its group never issued: under NCCL no wait shows it (the host
  // goes on), under Gloo the host waits on it, and either way only the transport's timeout would end
  // it, naming this rank's own operation.
  if (mine.unfinished && mine.unfinished_for >= overdue_) {
    const issued_collective& unfinished = *mine.unfinished;
    std::vector<const peer_record*> not_issued;
    std::vector<int> issued{rank_};
    for (const peer_record& peer : peers) {
      if (peer.rank == rank_ || !peer.progress || !unfinished.group.includes(peer.rank)) continue;
      if (peer.progress->issued_over(unfinished.group) < unfinished.number) {
        not_issued.push_back(&peer);
      } else {
        issued.push_back(peer.rank);
      }
    }
    if (!not_issued.empty()) {
      std::sort(not_issued.begin(), not_issued.end(), [](const auto* a, const auto* b) { return a->rank < b->rank; });
      std::sort(issued.begin(), issued.end());
      std::vector<int> not_issued_ranks;
      for (const peer_record* peer : not_issued) not_issued_ranks.push_back(peer->rank);
      const peer_record& first = *not_issued.front();
      const bool one = not_issued.size() == 1;
      return finding{
          peer_not_issued, first.rank,
          fmt::format("{} {} not issued {}, which {} {} on (rank {} issued it {:g} s ago; rank {}'s last beat: {}): "
                      "{} stuck outside loom's collectives, or {}",
                      ranks_text(not_issued_ranks), one ? "has" : "have", unfinished.to_string(), ranks_text(issued),
                      issued.size() == 1 ? "waits" : "wait", rank_, seconds(mine.unfinished_for), first.rank,
                      first.progress->where(), one ? "it is" : "they are", different_collectives)};
    }
  }
  return std::nullopt;
}

}  // namespace loom

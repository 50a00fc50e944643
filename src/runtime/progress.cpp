#include <loom/runtime/progress.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <vector>

namespace loom {
namespace {

constexpr int position_fields = 3;                      // pass, part, ordinal
constexpr int record_fields = 1 + position_fields + 3;  // beat, the position, waiting, waited, collective

// The next space-separated integer of `text`, consumed.
std::optional<std::int64_t> next_integer(std::string_view& text) {
  std::int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc{}) return std::nullopt;
  text.remove_prefix(static_cast<std::size_t>(end - text.data()));
  if (!text.empty()) {
    if (text.front() != ' ') return std::nullopt;
    text.remove_prefix(1);
  }
  return value;
}

std::optional<std::vector<std::int64_t>> integers(std::string_view& text, int count) {
  std::vector<std::int64_t> values;
  for (int i = 0; i < count; ++i) {
    auto value = next_integer(text);
    if (!value) return std::nullopt;
    values.push_back(*value);
  }
  return values;
}

std::optional<job_position> position_from(const std::vector<std::int64_t>& fields, std::size_t first) {
  const std::int64_t part = fields[first + 1];
  if (part < 0 || part > static_cast<std::int64_t>(pass_part::between)) return std::nullopt;
  return job_position{fields[first], static_cast<pass_part>(part), fields[first + 2]};
}

std::string position_fields_text(const job_position& at) {
  return fmt::format("{} {} {}", at.pass, static_cast<int>(at.part), at.ordinal);
}

// A group as one word of the record: "*" for the world, else "shard.1=2,3".
constexpr std::string_view world_word = "*";

std::string group_word(const collective_group& group) {
  if (group.world()) return std::string(world_word);
  return fmt::format("{}={}", group.name, fmt::join(group.members, ","));
}

std::optional<collective_group> group_from(std::string_view word) {
  if (word == world_word) return collective_group{};
  const std::size_t equals = word.find('=');
  if (equals == std::string_view::npos || equals == 0) return std::nullopt;
  collective_group group{std::string(word.substr(0, equals)), {}};
  std::string_view members = word.substr(equals + 1);
  while (!members.empty()) {
    int rank = 0;
    const auto [end, error] = std::from_chars(members.data(), members.data() + members.size(), rank);
    if (error != std::errc{}) return std::nullopt;
    group.members.push_back(rank);
    members.remove_prefix(static_cast<std::size_t>(end - members.data()));
    if (!members.empty()) {
      if (members.front() != ',' || members.size() == 1) return std::nullopt;
      members.remove_prefix(1);
    }
  }
  if (group.members.empty()) return std::nullopt;
  return group;
}

}  // namespace

std::string job_position::to_string() const {
  switch (part) {
    case pass_part::forward: return fmt::format("the forward of pass {}", pass);
    case pass_part::backward: return fmt::format("the backward of pass {}", pass);
    case pass_part::between: break;
  }
  return pass == 0 ? "before the first pass" : fmt::format("after pass {}", pass);
}

bool collective_group::includes(int rank) const noexcept {
  return world() || std::find(members.begin(), members.end(), rank) != members.end();
}

std::string progress_snapshot::where() const {
  const std::string place = at.to_string();
  if (waiting == wait_kind::collective) {
    return fmt::format("{}{} {}", what, group.world() ? std::string() : " over " + group.name,
                       place.starts_with("the ") ? "in " + place : place);
  }
  if (waiting == wait_kind::part) return fmt::format("{} ({})", place, what);
  if (waiting == wait_kind::host_read) {
    if (collective == 0) return fmt::format("a host read {}", place.starts_with("the ") ? "in " + place : place);
    return fmt::format("a host read after {}{} {}", what, group.world() ? std::string() : " over " + group.name,
                       place.starts_with("the ") ? "in " + place : place);
  }
  return place;
}

std::string encode_progress(std::int64_t beat, const progress_snapshot& snapshot) {
  return fmt::format("{} {} {} {} {} {} {}", beat, position_fields_text(snapshot.at),
                     static_cast<int>(snapshot.waiting), snapshot.waited.count(), snapshot.collective,
                     group_word(snapshot.group), snapshot.what);
}

std::optional<std::pair<std::int64_t, progress_snapshot>> decode_progress(std::string_view text) {
  const auto fields = integers(text, record_fields);
  if (!fields) return std::nullopt;
  const auto at = position_from(*fields, 1);
  const std::int64_t waiting = (*fields)[4];
  if (!at || waiting < 0 || waiting > static_cast<std::int64_t>(wait_kind::host_read)) return std::nullopt;
  const std::size_t space = text.find(' ');
  const std::optional<collective_group> group = group_from(text.substr(0, space));
  if (!group) return std::nullopt;
  text.remove_prefix(space == std::string_view::npos ? text.size() : space + 1);
  return std::pair{(*fields)[0],
                   progress_snapshot{*at, static_cast<wait_kind>(waiting), std::chrono::milliseconds((*fields)[5]),
                                     (*fields)[6], std::string(text), *group}};
}

std::string encode_position(const job_position& at) { return position_fields_text(at); }

std::optional<job_position> decode_position(std::string_view text) {
  const auto fields = integers(text, position_fields);
  if (!fields || !text.empty()) return std::nullopt;
  return position_from(*fields, 0);
}

void job_progress::enter(pass_part part, bool communicates, std::string collectives) {
  std::lock_guard lock(mutex_);
  if (part == pass_part::forward) ++at_.pass;
  at_.part = part;
  if (communicates) ++at_.ordinal;
  part_communicates_ = communicates;
  part_collectives_ = std::move(collectives);
  part_since_ = clock::now();
}

void job_progress::leave_part() {
  std::lock_guard lock(mutex_);
  if (at_.part == pass_part::between) return;
  at_.part = pass_part::between;
  if (part_communicates_) ++at_.ordinal;
  part_communicates_ = false;
  part_collectives_.clear();
}

job_progress::wait_scope::wait_scope(job_progress* tracker, std::int64_t number, std::string what,
                                     collective_group group)
    : tracker_(tracker) {
  if (tracker_ == nullptr) return;
  std::lock_guard lock(tracker_->mutex_);
  outer_ = std::exchange(tracker_->collective_, waited_collective{number, std::move(what), std::move(group)});
  outer_since_ = std::exchange(tracker_->collective_since_, clock::now());
}

job_progress::wait_scope::~wait_scope() {
  if (tracker_ == nullptr) return;
  std::lock_guard lock(tracker_->mutex_);
  tracker_->collective_ = std::move(outer_);
  tracker_->collective_since_ = outer_since_;
}

void job_progress::issued(std::int64_t number, std::string what, collective_group group) {
  std::lock_guard lock(mutex_);
  last_issued_ = waited_collective{number, std::move(what), std::move(group)};
}

job_progress::host_read_scope::host_read_scope(job_progress& tracker) : tracker_(tracker) {
  std::lock_guard lock(tracker_.mutex_);
  switch (tracker_.at_.part) {
    case pass_part::forward: ++tracker_.host_reads_.forward; break;
    case pass_part::backward: ++tracker_.host_reads_.backward; break;
    case pass_part::between: ++tracker_.host_reads_.between; break;
  }
  // Not inside a collective's wait: that wait already names what the rank is blocked on.
  if (tracker_.collective_) return;
  tracker_.collective_ = tracker_.last_issued_.value_or(waited_collective{0, {}, {}});
  tracker_.collective_since_ = clock::now();
  tracker_.reading_ = true;
}

job_progress::host_read_scope::~host_read_scope() {
  std::lock_guard lock(tracker_.mutex_);
  if (!tracker_.reading_) return;
  tracker_.collective_.reset();
  tracker_.reading_ = false;
}

host_read_counts job_progress::host_reads() const {
  std::lock_guard lock(mutex_);
  return host_reads_;
}

progress_snapshot job_progress::snapshot(clock::time_point now) const {
  std::lock_guard lock(mutex_);
  progress_snapshot snapshot{
      .at = at_, .waiting = wait_kind::none, .waited = {}, .collective = 0, .what = {}, .group = {}};
  const auto since = [&](clock::time_point start) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(now - start);
  };
  if (collective_) {
    snapshot.waiting = reading_ ? wait_kind::host_read : wait_kind::collective;
    snapshot.waited = since(collective_since_);
    snapshot.collective = collective_->number;
    snapshot.what = collective_->what;
    snapshot.group = collective_->group;
  } else if (part_communicates_) {
    snapshot.waiting = wait_kind::part;
    snapshot.waited = since(part_since_);
    snapshot.what = part_collectives_;
  }
  return snapshot;
}

}  // namespace loom

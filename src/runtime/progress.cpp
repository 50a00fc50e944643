#include <loom/runtime/progress.hpp>

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <vector>

namespace loom {
namespace {

constexpr int position_fields = 3;                      // pass, part, ordinal
constexpr int record_fields = 1 + position_fields + 3;  // beat, the position, waiting, waited, collective
constexpr int unfinished_fields = 2;                    // its number (0: none), how long ago it was issued
constexpr int record_lines = 3;                         // the position and the wait, the unfinished, the counts

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

// The group word that starts `text`, consumed with the space after it; the rest is free text.
std::optional<collective_group> next_group(std::string_view& text) {
  const std::size_t space = text.find(' ');
  std::optional<collective_group> group = group_from(text.substr(0, space));
  text.remove_prefix(space == std::string_view::npos ? text.size() : space + 1);
  return group;
}

// The next line of `text`, consumed with its newline.
std::string_view next_line(std::string_view& text) {
  const std::size_t newline = text.find('\n');
  const std::string_view line = text.substr(0, newline);
  text.remove_prefix(newline == std::string_view::npos ? text.size() : newline + 1);
  return line;
}

// "shard.1=2,3:811 *:40": each group's word and how many collectives were issued over it.
std::string issue_counts_text(const std::vector<group_issue_count>& counts) {
  std::string text;
  for (const group_issue_count& count : counts) {
    text += fmt::format("{}{}:{}", text.empty() ? "" : " ", group_word(count.group), count.issued);
  }
  return text;
}

std::optional<std::vector<group_issue_count>> issue_counts_from(std::string_view text) {
  std::vector<group_issue_count> counts;
  while (!text.empty()) {
    const std::size_t space = text.find(' ');
    const std::string_view word = text.substr(0, space);
    text.remove_prefix(space == std::string_view::npos ? text.size() : space + 1);
    const std::size_t colon = word.rfind(':');
    if (colon == std::string_view::npos) return std::nullopt;
    auto group = group_from(word.substr(0, colon));
    std::string_view number = word.substr(colon + 1);
    auto issued = next_integer(number);
    if (!group || !issued || !number.empty()) return std::nullopt;
    counts.push_back({std::move(*group), *issued});
  }
  return counts;
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

std::string issued_collective::to_string() const {
  return fmt::format("collective #{}, {}{}", number, what, group.world() ? std::string() : " over " + group.name);
}

std::int64_t progress_snapshot::issued_over(const collective_group& over) const noexcept {
  const auto found = std::find_if(issued.begin(), issued.end(), [&](const auto& count) { return count.group == over; });
  return found == issued.end() ? 0 : found->issued;
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
  const issued_collective none{};
  const issued_collective& unfinished = snapshot.unfinished.value_or(none);
  return fmt::format("{} {} {} {} {} {} {}\n{} {} {} {}\n{}", beat, position_fields_text(snapshot.at),
                     static_cast<int>(snapshot.waiting), snapshot.waited.count(), snapshot.collective,
                     group_word(snapshot.group), snapshot.what, unfinished.number, snapshot.unfinished_for.count(),
                     group_word(unfinished.group), unfinished.what, issue_counts_text(snapshot.issued));
}

std::optional<std::pair<std::int64_t, progress_snapshot>> decode_progress(std::string_view text) {
  if (std::count(text.begin(), text.end(), '\n') != record_lines - 1) return std::nullopt;
  std::string_view line = next_line(text);
  const auto fields = integers(line, record_fields);
  if (!fields) return std::nullopt;
  const auto at = position_from(*fields, 1);
  const std::int64_t waiting = (*fields)[4];
  if (!at || waiting < 0 || waiting > static_cast<std::int64_t>(wait_kind::host_read)) return std::nullopt;
  std::optional<collective_group> group = next_group(line);
  if (!group) return std::nullopt;
  progress_snapshot snapshot{*at,
                             static_cast<wait_kind>(waiting),
                             std::chrono::milliseconds((*fields)[5]),
                             (*fields)[6],
                             std::string(line),
                             std::move(*group)};

  line = next_line(text);
  const auto unfinished = integers(line, unfinished_fields);
  if (!unfinished || (*unfinished)[0] < 0) return std::nullopt;
  std::optional<collective_group> unfinished_group = next_group(line);
  if (!unfinished_group) return std::nullopt;
  if ((*unfinished)[0] > 0) {
    snapshot.unfinished = issued_collective{(*unfinished)[0], std::string(line), std::move(*unfinished_group)};
    snapshot.unfinished_for = std::chrono::milliseconds((*unfinished)[1]);
  }

  auto counts = issue_counts_from(text);
  if (!counts) return std::nullopt;
  snapshot.issued = std::move(*counts);
  return std::pair{(*fields)[0], std::move(snapshot)};
}

std::string encode_position(const job_position& at) { return position_fields_text(at); }

std::optional<job_position> decode_position(std::string_view text) {
  const auto fields = integers(text, position_fields);
  if (!fields || !text.empty()) return std::nullopt;
  return position_from(*fields, 0);
}

job_progress::job_progress() = default;
job_progress::~job_progress() = default;

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
  outer_ = std::exchange(tracker_->collective_, issued_collective{number, std::move(what), std::move(group)});
  outer_since_ = std::exchange(tracker_->collective_since_, clock::now());
}

job_progress::wait_scope::~wait_scope() {
  if (tracker_ == nullptr) return;
  std::lock_guard lock(tracker_->mutex_);
  tracker_->collective_ = std::move(outer_);
  tracker_->collective_since_ = outer_since_;
}

void job_progress::issued(issued_collective collective, c10::intrusive_ptr<c10d::Work> work) {
  std::lock_guard lock(mutex_);
  const auto count = std::find_if(issued_.begin(), issued_.end(),
                                  [&](const group_issue_count& counted) { return counted.group == collective.group; });
  if (count == issued_.end()) {
    issued_.push_back({collective.group, collective.number});
  } else {
    count->issued = collective.number;
  }
  in_flight_.push_back({std::move(collective), clock::now(), std::move(work)});
  drop_finished();
}

void job_progress::finished(const c10d::Work* work) {
  std::lock_guard lock(mutex_);
  const auto waited = std::find_if(in_flight_.begin(), in_flight_.end(),
                                   [work](const in_flight& collective) { return collective.work.get() == work; });
  if (waited != in_flight_.end()) waited->work.reset();
  drop_finished();
}

bool job_progress::in_flight::finished() const { return !work || work->isCompleted(); }

void job_progress::drop_finished() {
  while (in_flight_.size() > 1 && in_flight_.front().finished()) in_flight_.pop_front();
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
  tracker_.collective_ = tracker_.in_flight_.empty() ? issued_collective{} : tracker_.in_flight_.back().collective;
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
  progress_snapshot snapshot{.at = at_,
                             .waiting = wait_kind::none,
                             .waited = {},
                             .collective = 0,
                             .what = {},
                             .group = {},
                             .unfinished = {},
                             .unfinished_for = {},
                             .issued = issued_};
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
  // Asked without blocking (under NCCL, of the collective's event on its stream).
  const auto unfinished = std::find_if(in_flight_.begin(), in_flight_.end(),
                                       [](const in_flight& collective) { return !collective.finished(); });
  if (unfinished != in_flight_.end()) {
    snapshot.unfinished = unfinished->collective;
    snapshot.unfinished_for = since(unfinished->issued_at);
  }
  return snapshot;
}

}  // namespace loom

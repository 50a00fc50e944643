#include <loom/schedule/cursor.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace loom {

std::size_t schedule_cursor::declare(collective_schedule& schedule, std::vector<schedule_entry> entries, issue_fn issue,
                                     gradient_sync needs, std::size_t branch) {
  std::string text = "no collective";
  if (!entries.empty() && !entries.front().tensors.empty()) {
    const schedule_entry& first = entries.front();
    const std::string& last_name = first.tensors.back().name;
    text = fmt::format("entry #{} ({} {}, {} B: {}{})", schedule.entries().size(), to_string(first.op),
                       to_string(first.phase), first.bytes(), first.tensors.front().name,
                       first.tensors.size() > 1 ? " ... " + last_name : std::string());
  }
  const std::size_t first_entry = schedule.entries().size();
  const std::size_t count = entries.size();
  for (schedule_entry& entry : entries) schedule.add(std::move(entry));
  declared_.push_back({std::move(issue), needs, std::move(text), first_entry, count, branch});
  return declared_.size() - 1;
}

void schedule_cursor::issue_through(std::size_t index, gradient_sync sync) {
  const std::size_t end = std::min(index + 1, declared_.size());
  for (; next_ < end; ++next_) {
    const declared_collective& collective = declared_[next_];
    if (collective.needs > sync) continue;
    if (collective.branch != every_branch && collective.branch != taken_branch_) continue;
    collective.issue();
    for (std::size_t e = 0; e < collective.entries; ++e) issued_entries_.push_back(collective.first_entry + e);
  }
}

void schedule_cursor::issue_rest(gradient_sync sync) {
  if (!declared_.empty()) issue_through(declared_.size() - 1, sync);
}

}  // namespace loom

#include <loom/schedule/schedule.hpp>

#include <loom/base/text.hpp>
#include <loom/runtime/agreement.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <ranges>
#include <sstream>
#include <string_view>
#include <utility>

namespace loom {
namespace {

// A schedule line, "all_gather forward shard.0 160 B [a Float[8,4], b Float[8]]", as what the
// collective is ("all_gather forward over shard.0") and the tensors it carries.
std::pair<std::string, std::vector<std::string>> collective_parts(std::string_view line) {
  const std::size_t open = std::min(line.find(" ["), line.size());
  std::vector<std::string> words;
  for (const auto word : std::views::split(line.substr(0, open), ' ')) words.emplace_back(word.begin(), word.end());
  std::string what = words.empty() ? std::string(line) : words[0];
  if (words.size() >= 3) what = fmt::format("{} {} over {}", words[0], words[1], words[2]);
  std::vector<std::string> tensors;
  if (open < line.size() && line.ends_with(']')) {
    const std::string_view inside = line.substr(open + 2, line.size() - open - 3);
    for (std::size_t start = 0; start <= inside.size();) {
      const std::size_t comma = std::min(inside.find(", ", start), inside.size());
      if (comma > start) tensors.emplace_back(inside.substr(start, comma - start));
      start = comma + 2;
    }
  }
  return {std::move(what), std::move(tensors)};
}

}  // namespace

std::string_view to_string(collective_op op) noexcept {
  switch (op) {
    case collective_op::all_reduce: return "all_reduce";
    case collective_op::broadcast: return "broadcast";
    case collective_op::all_gather: return "all_gather";
    case collective_op::reduce_scatter: return "reduce_scatter";
    case collective_op::all_to_all: return "all_to_all";
    case collective_op::barrier: return "barrier";
  }
  return "?";
}

std::string_view to_string(step_phase phase) noexcept {
  switch (phase) {
    case step_phase::forward: return "forward";
    case step_phase::recompute: return "recompute";
    case step_phase::backward: return "backward";
    case step_phase::optimizer: return "optimizer";
  }
  return "?";
}

std::int64_t schedule_entry::bytes() const noexcept {
  std::int64_t total = 0;
  for (const tensor_spec& t : tensors) total += t.bytes();
  return total;
}

std::string schedule_entry::to_string() const {
  std::vector<std::string> specs;
  for (const tensor_spec& t : tensors) specs.push_back(t.to_string());
  return fmt::format("{} {} {} {} B{}{} [{}]", loom::to_string(op), loom::to_string(phase), group, bytes(),
                     per_token ? "/token" : "", branch.empty() ? std::string() : " if " + branch,
                     fmt::join(specs, ", "));
}

void collective_schedule::add(schedule_entry entry) { entries_.push_back(std::move(entry)); }

std::int64_t collective_schedule::bytes_per_step() const noexcept {
  std::int64_t total = 0;
  for (const schedule_entry& e : entries_) total += e.per_token ? 0 : e.bytes();
  return total;
}

std::int64_t collective_schedule::bytes_per_token() const noexcept {
  std::int64_t total = 0;
  for (const schedule_entry& e : entries_) total += e.per_token ? e.bytes() : 0;
  return total;
}

std::uint64_t collective_schedule::fingerprint() const { return fnv1a(entry_lines(), fnv1a("loom schedule v1\n")); }

std::string collective_schedule::entry_lines() const {
  std::string lines;
  for (const schedule_entry& e : entries_) lines += e.to_string() + "\n";
  return lines;
}

std::string collective_schedule::to_string() const {
  const std::int64_t per_token = bytes_per_token();
  std::string text = fmt::format(
      "collective schedule: {} collectives a step, {} B{}, fingerprint {:016x}\n", entries_.size(), bytes_per_step(),
      per_token > 0 ? fmt::format(" and {} B a token of the sequence", per_token) : "", fingerprint());
  for (std::size_t i = 0; i < entries_.size(); ++i) text += fmt::format("  #{} {}\n", i, entries_[i].to_string());
  return text;
}

void verify_schedule_across_ranks(const collective_schedule& schedule, const runtime& rt) {
  const auto entries = schedule.entries();
  std::vector<std::uint64_t> hashes;
  for (const schedule_entry& e : entries) hashes.push_back(fnv1a(e.to_string()));
  require_agreement(
      rt, "schedule", hashes, [&](std::size_t i) { return entries[i].to_string(); },
      [](const disagreement& d) {
        return error_message(
            "the ranks' collective schedules differ, so their collectives would not match (a hang); first "
            "difference at entry #{}: rank 0 has '{}', rank {} has '{}'. Every rank must build the same plan on the "
            "same model; compare job.schedule() across ranks",
            d.index, d.rank0_item, d.rank, d.other_item);
      });
}

std::string schedule_difference(const std::string& saved, const std::string& now) {
  const auto lines = [](const std::string& text) {
    std::vector<std::string> all;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) all.push_back(line);
    return all;
  };
  const std::vector<std::string> before = lines(saved);
  const std::vector<std::string> after = lines(now);
  for (std::size_t i = 0; i < std::min(before.size(), after.size()); ++i) {
    if (before[i] == after[i]) continue;
    const auto [was, was_carrying] = collective_parts(before[i]);
    const auto [is, carrying] = collective_parts(after[i]);
    if (was != is)
      return fmt::format("the step's collective {} was {} in the saved run, {} in this job", i + 1, was, is);
    for (std::size_t k = 0; k < std::min(was_carrying.size(), carrying.size()); ++k) {
      if (was_carrying[k] != carrying[k]) {
        return fmt::format("the step's collective {} ({}) carried '{}' in the saved run, '{}' in this job", i + 1, is,
                           was_carrying[k], carrying[k]);
      }
    }
    return fmt::format("the step's collective {} ({}) carried {} in the saved run, {} in this job", i + 1, is,
                       counted(static_cast<std::int64_t>(was_carrying.size()), "tensor"),
                       counted(static_cast<std::int64_t>(carrying.size()), "tensor"));
  }
  return fmt::format("a step had {} in the saved run, {} in this job",
                     counted(static_cast<std::int64_t>(before.size()), "collective"),
                     counted(static_cast<std::int64_t>(after.size()), "collective"));
}

}  // namespace loom

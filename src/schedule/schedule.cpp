#include <loom/schedule/schedule.hpp>

#include <loom/runtime/agreement.hpp>
#include <loom/runtime/text.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace loom {

std::string_view to_string(collective_op op) noexcept {
  switch (op) {
    case collective_op::all_reduce: return "all_reduce";
    case collective_op::broadcast: return "broadcast";
    case collective_op::all_gather: return "all_gather";
    case collective_op::reduce_scatter: return "reduce_scatter";
    case collective_op::barrier: return "barrier";
  }
  return "?";
}

std::string_view to_string(step_phase phase) noexcept {
  switch (phase) {
    case step_phase::forward: return "forward";
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
  return fmt::format("{} {} {} {} B [{}]", loom::to_string(op), loom::to_string(phase), group, bytes(),
                     fmt::join(specs, ", "));
}

void collective_schedule::add(schedule_entry entry) { entries_.push_back(std::move(entry)); }

std::int64_t collective_schedule::bytes_per_step() const noexcept {
  std::int64_t total = 0;
  for (const schedule_entry& e : entries_) total += e.bytes();
  return total;
}

std::uint64_t collective_schedule::fingerprint() const {
  std::uint64_t hash = fnv1a("loom schedule v1\n");
  for (const schedule_entry& e : entries_) hash = fnv1a(e.to_string() + "\n", hash);
  return hash;
}

std::string collective_schedule::to_string() const {
  std::string text = fmt::format("collective schedule: {} collectives a step, {} B, fingerprint {:016x}\n",
                                 entries_.size(), bytes_per_step(), fingerprint());
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

}  // namespace loom

#include <loom/schedule.hpp>

#include <loom/detail/consensus.hpp>
#include <loom/runtime.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <ATen/ATen.h>

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

std::int64_t tensor_spec::numel() const noexcept {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

std::int64_t tensor_spec::bytes() const noexcept {
  return numel() * static_cast<std::int64_t>(c10::elementSize(dtype));
}

std::int64_t schedule_entry::bytes() const noexcept {
  std::int64_t total = 0;
  for (const tensor_spec& t : tensors) total += t.bytes();
  return total;
}

std::string schedule_entry::to_string() const {
  std::vector<std::string> specs;
  for (const tensor_spec& t : tensors) {
    specs.push_back(fmt::format("{} {}[{}]", t.name, c10::toString(t.dtype), fmt::join(t.shape, ",")));
  }
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
  std::uint64_t hash = detail::fnv1a("loom schedule v1\n");
  for (const schedule_entry& e : entries_) hash = detail::fnv1a(e.to_string() + "\n", hash);
  return hash;
}

std::string collective_schedule::to_string() const {
  std::string text = fmt::format("collective schedule: {} collectives a step, {} B, fingerprint {:016x}\n",
                                 entries_.size(), bytes_per_step(), fingerprint());
  for (std::size_t i = 0; i < entries_.size(); ++i) text += fmt::format("  #{} {}\n", i, entries_[i].to_string());
  return text;
}

void verify_schedule_across_ranks(const collective_schedule& schedule, const runtime& rt) {
  if (!rt.is_distributed()) return;
  std::vector<std::uint64_t> hashes{schedule.fingerprint()};
  if (!detail::first_divergence(rt, hashes)) return;

  hashes.clear();
  for (const schedule_entry& e : schedule.entries()) hashes.push_back(detail::fnv1a(e.to_string()));
  auto where = detail::first_divergence(rt, hashes);
  const std::size_t index = where ? where->index : schedule.entries().size();
  const int other = where ? where->rank : 0;
  const auto entries = schedule.entries();
  const std::string mine = index < entries.size() ? entries[index].to_string() : "(no such entry)";
  auto texts = detail::share_text(rt, "loom/schedule/" + std::to_string(index), mine);
  throw rank_mismatch(fmt::format(
      "loom: the ranks' collective schedules differ, so their collectives would not match (a hang); first "
      "difference at entry #{}: rank 0 has '{}', rank {} has '{}'. Every rank must build the same plan on the "
      "same model; compare job.schedule() across ranks",
      index, texts[0], other, texts[static_cast<std::size_t>(other)]));
}

}  // namespace loom

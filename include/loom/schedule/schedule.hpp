#pragma once
// The collective schedule: the ordered collectives that one training step issues, derived by the
// strategy before the first step from the plan and the parameters in registration order. It is
// identical on every rank by construction; build() checks that through its fingerprint.
// Format: docs/schedule.md.

#include <loom/runtime/tensors.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace loom {

class runtime;

enum class collective_op { all_reduce, broadcast, all_gather, reduce_scatter, all_to_all, barrier };
// recompute: a unit's forward run again in backward (recompute(...)), with its collectives.
enum class step_phase { forward, recompute, backward, optimizer };

[[nodiscard]] std::string_view to_string(collective_op op) noexcept;
[[nodiscard]] std::string_view to_string(step_phase phase) noexcept;

struct schedule_entry {
  collective_op op;
  step_phase phase;
  std::vector<tensor_spec> tensors;  // communicated as one flat buffer, in this order
  std::string group = "world";
  // The tensors are one token's (sequence parallelism's all-to-alls): a step sends bytes() times the
  // tokens of the rank's part of its batch.
  bool per_token = false;
  // The loom::nn::Branch whose collective it is (loom/nn/branch.hpp): issued in a pass that takes
  // that branch, passed over in the others. Empty: every pass's.
  std::string branch{};

  [[nodiscard]] std::int64_t bytes() const noexcept;
  // One line: "all_reduce backward world 1310720 B [head.bias f32[128], head.weight f32[128,256]]",
  // or "... 1536 B/token [...]" per token, "... 1024 B if transformer_2 [...]" in a branch.
  [[nodiscard]] std::string to_string() const;
};

class collective_schedule {
 public:
  void add(schedule_entry entry);
  [[nodiscard]] std::span<const schedule_entry> entries() const noexcept { return entries_; }
  [[nodiscard]] bool empty() const noexcept { return entries_.empty(); }
  // The bytes of the entries whose size is fixed, and the bytes per token of those per token.
  [[nodiscard]] std::int64_t bytes_per_step() const noexcept;
  [[nodiscard]] std::int64_t bytes_per_token() const noexcept;

  // FNV-1a over every entry's line, in order.
  [[nodiscard]] std::uint64_t fingerprint() const;
  // A header (entries, bytes, fingerprint), then one numbered line per entry.
  [[nodiscard]] std::string to_string() const;
  // Every entry's line, each ending in a newline: what the fingerprint digests.
  [[nodiscard]] std::string entry_lines() const;

 private:
  std::vector<schedule_entry> entries_;
};

// Where two schedules' entry_lines() differ, in words: the first collective of the step that is
// another ("the step's collective 3 (all_gather forward over shard.0) carried 'w f32[64]' in the
// saved run, 'w f32[128]' in this job"), or how many a step has. `saved` comes from a checkpoint.
[[nodiscard]] std::string schedule_difference(const std::string& saved, const std::string& now);

// Checks through the agreement service (loom/runtime/agreement.hpp) that every rank derived the
// same entries; throws rank_mismatch naming the first differing entry and the ranks' versions of it.
void verify_schedule_across_ranks(const collective_schedule& schedule, const runtime& rt);

}  // namespace loom

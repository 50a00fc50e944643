#pragma once
// Groups of `size` consecutive ranks that share one piece of work (sequence_parallel's sequence,
// tensor_parallel's layers), as torchtitan places its cp and tp dimensions within a node; the groups
// are the data-parallel ranks, each reading its own batches.
//
//   world 4, size 2:  group 0 = {0, 1}, group 1 = {2, 3}; data-parallel rank of 2 and 3: 1 of 2
//
// A group has a backend of its own, a group of the whole world too (its collectives never queue
// behind another group's on one NCCL stream); a group of one rank has none.

#include <loom/runtime/collectives.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

class runtime;

// What a kind of group is called: the stage that asks for it ("sequence_parallel"), its groups'
// name ("sequence": "sequence.1", "sequence[2]") and what each group shares, for the messages.
struct rank_group_kind {
  std::string_view stage;
  std::string_view name;
  std::string_view shares;  // "one sequence"
};

class rank_group {
 public:
  // This rank's group of `size` consecutive ranks. Every rank must ask for the same size, and it must
  // divide the world size: otherwise every rank throws std::invalid_argument naming the fix.
  rank_group(const runtime& rt, int size, rank_group_kind kind);
  ~rank_group();
  rank_group(const rank_group&) = delete;
  rank_group& operator=(const rank_group&) = delete;

  [[nodiscard]] int size() const noexcept { return size_; }
  // This rank's place in its group: which part of the shared work it keeps.
  [[nodiscard]] int rank() const noexcept { return rank_ % size_; }
  // The data-parallel place: which group this rank's is, of how many.
  [[nodiscard]] int data_rank() const noexcept { return rank_ / size_; }
  [[nodiscard]] int data_world_size() const noexcept { return world_size_ / size_; }

  [[nodiscard]] collectives& comm() const noexcept { return *comm_; }
  // Collectives over host tensors among the same ranks (Gloo): the group's own under Gloo, one more
  // group under NCCL.
  [[nodiscard]] collectives& host_comm() const noexcept { return host_ ? *host_ : *comm_; }
  // "sequence.1": this rank's group.
  [[nodiscard]] std::string name() const;
  // "sequence[2]": how a schedule names the group, the same on every rank.
  [[nodiscard]] std::string role() const;
  // Its members, by world rank, ascending.
  [[nodiscard]] std::vector<int> ranks() const;

 private:
  rank_group_kind kind_;
  int rank_ = 0;
  int world_size_ = 1;
  int size_ = 1;
  std::unique_ptr<collectives> comm_;
  std::unique_ptr<collectives> host_;  // under NCCL only
};

}  // namespace loom

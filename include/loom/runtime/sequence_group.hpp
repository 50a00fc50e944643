#pragma once
// Sequence parallelism's arrangement of the ranks (torchtitan's cp dimension, FastVideo's sp group):
// consecutive ranks form a sequence group of `size`, which splits one sequence among them; the
// groups are the data-parallel ranks, each reading its own batches.
//
//   world 4, size 2:  sequence.0 = {0, 1}, sequence.1 = {2, 3}; data-parallel rank of 2 and 3: 1 of 2
//
// A group has a backend of its own, a group of the whole world too (its all-to-alls never queue behind
// another group's collectives on one NCCL stream); a group of one rank has none.

#include <loom/runtime/collectives.hpp>

#include <memory>
#include <string>
#include <vector>

namespace loom {

class runtime;

class sequence_group {
 public:
  // This rank's group of `size` consecutive ranks. Every rank must ask for the same size, and it must
  // divide the world size: otherwise every rank throws std::invalid_argument naming the fix.
  sequence_group(const runtime& rt, int size);
  ~sequence_group();
  sequence_group(const sequence_group&) = delete;
  sequence_group& operator=(const sequence_group&) = delete;

  [[nodiscard]] int size() const noexcept { return size_; }
  // This rank's place in its group: which part of each sequence it keeps.
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
  int rank_ = 0;
  int world_size_ = 1;
  int size_ = 1;
  std::unique_ptr<collectives> comm_;
  std::unique_ptr<collectives> host_;  // under NCCL only
};

}  // namespace loom

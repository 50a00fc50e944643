#pragma once
// Hybrid sharding's arrangement of the ranks (FSDP2's 2-D DeviceMesh (replicate, shard),
// torchtitan's dp_replicate × dp_shard): consecutive ranks form a shard group of `shard_size` (a
// node, when it is LOCAL_WORLD_SIZE), and the ranks at the same place in every shard group form a
// replicate group. Each group has a c10d backend of its own and loom's collectives over it.
//
//   world 4, shard_size 2:  shard.0 = {0, 1}, shard.1 = {2, 3}; replicate.0 = {0, 2}, replicate.1 = {1, 3}
//
// A shard group of the whole world is the world's own group (plain FSDP), with replicate groups of
// one rank: no backend is made for either.

#include <loom/runtime/collectives.hpp>

#include <memory>
#include <string>
#include <vector>

namespace loom {

class runtime;

class rank_mesh {
 public:
  // The ranks first agree on `shard_size` (rank_mismatch on every rank, naming both sizes); one that
  // does not divide the world size is std::invalid_argument on every rank. Then every rank makes the
  // two groups it is in, its shard group first, under names no earlier mesh of this job used (a
  // collective over the world: every rank builds every mesh, in the same order, as c10d's new_group).
  rank_mesh(const runtime& rt, int shard_size);
  ~rank_mesh();
  rank_mesh(rank_mesh&&) noexcept;
  rank_mesh& operator=(rank_mesh&&) noexcept;

  [[nodiscard]] int shard_size() const noexcept { return shard_size_; }
  [[nodiscard]] int replicate_size() const noexcept { return replicate_size_; }
  // This rank's place: which shard group it is in, and its rank there (its replicate group's index).
  [[nodiscard]] int shard_index() const noexcept { return rank_ / shard_size_; }
  [[nodiscard]] int shard_rank() const noexcept { return rank_ % shard_size_; }

  // Collectives over this rank's shard group (rank shard_rank() of shard_size()) and its replicate
  // group (rank shard_index() of replicate_size()).
  [[nodiscard]] collectives& shard() const noexcept { return *shard_; }
  [[nodiscard]] collectives& replicate() const noexcept { return *replicate_; }
  // This rank's groups: "shard.1", "replicate.0".
  [[nodiscard]] std::string shard_group() const;
  [[nodiscard]] std::string replicate_group() const;
  // How a schedule names the group of a collective, the same on every rank: "shard[2]" and
  // "replicate[2]" (a group's role and size), "world" for a shard group of every rank.
  [[nodiscard]] std::string shard_role() const;
  [[nodiscard]] std::string replicate_role() const;
  // Their members, by world rank, ascending.
  [[nodiscard]] std::vector<int> shard_ranks() const;
  [[nodiscard]] std::vector<int> replicate_ranks() const;

 private:
  int rank_ = 0;
  int shard_size_ = 1;
  int replicate_size_ = 1;
  std::unique_ptr<collectives> own_shard_;  // none when the shard group is the world
  collectives* shard_ = nullptr;
  std::unique_ptr<collectives> replicate_;
};

}  // namespace loom

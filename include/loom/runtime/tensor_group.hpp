#pragma once
// Tensor parallelism's arrangement of the ranks (torchtitan's 2-D mesh dp × tp, Megatron's tensor
// model parallel group): groups of `size` consecutive ranks, each splitting every parallel layer of
// the model among them (loom/runtime/rank_group.hpp), and the data-parallel ranks across them: the
// ranks at the same place in every group, which hold the same slices and which the strategy runs over.
//
//   world 4, size 2:  tensor.0 = {0, 1}, tensor.1 = {2, 3}; data.0 = {0, 2}, data.1 = {1, 3}

#include <loom/runtime/rank_group.hpp>
#include <loom/runtime/runtime.hpp>

#include <string>
#include <vector>

namespace loom {

class tensor_group : public rank_group {
 public:
  // A collective over the world: every rank makes its tensor group, then its data-parallel one.
  tensor_group(const runtime& rt, int size);

  // The ranks that hold this rank's slices (world / size of them, one in each tensor group), as the
  // strategy sees its world: its rank there is data_rank().
  [[nodiscard]] const runtime& data_parallel() const noexcept { return data_parallel_; }
  // "data.1": this rank's data-parallel group; its members by world rank, ascending.
  [[nodiscard]] std::string data_parallel_name() const;
  [[nodiscard]] std::vector<int> data_parallel_ranks() const;

 private:
  runtime data_parallel_;
};

}  // namespace loom

#pragma once
// Sequence parallelism's arrangement of the ranks (torchtitan's cp dimension, FastVideo's sp group):
// groups of `size` consecutive ranks, each splitting one sequence among them (loom/runtime/rank_group.hpp).
//
//   world 4, size 2:  sequence.0 = {0, 1}, sequence.1 = {2, 3}; data-parallel rank of 2 and 3: 1 of 2

#include <loom/runtime/rank_group.hpp>

namespace loom {

class sequence_group : public rank_group {
 public:
  sequence_group(const runtime& rt, int size)
      : rank_group(rt, size, {.stage = "sequence_parallel", .name = "sequence", .shares = "one sequence"}) {}
};

}  // namespace loom

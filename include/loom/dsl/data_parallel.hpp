// Which batches a rank reads, known before the build. The ranks of one sequence group
// (sequence_parallel(k)) or of one tensor-parallel group (tensor_parallel(k)) read the same ones, so
// rank r is data-parallel rank r / k of world / k (the job says the same, job.data_rank()); without
// either stage, the rank of the world.
#pragma once

#include <cstddef>

namespace loom {

class sequence_parallel_stage;  // loom/dsl/sequence_parallel.hpp
class tensor_parallel_stage;    // loom/dsl/tensor_parallel.hpp

struct data_parallel_place {
  int rank = 0;
  int world_size = 1;
};

namespace detail {

// Rank `rank` of a world cut into groups of `group_size` consecutive ranks. A size that does not
// divide the world leaves the world's place: the build names that.
constexpr data_parallel_place data_parallel_in_groups(std::size_t group_size, int rank, int world_size) noexcept {
  if (group_size < 1 || world_size < 1 || group_size > static_cast<std::size_t>(world_size)) return {rank, world_size};
  const int size = static_cast<int>(group_size);
  if (world_size % size != 0) return {rank, world_size};
  return {rank / size, world_size / size};
}

}  // namespace detail

// The place a plan gives, from its stages: anything that finds them by find<S>() (a typed plan, a
// run file's run_plan, a stage_list). A group is sequence_parallel's size × tensor_parallel's.
template <class Stages>
requires requires(const Stages& stages) {
  stages.template find<sequence_parallel_stage>();
  stages.template find<tensor_parallel_stage>();
}
constexpr data_parallel_place data_parallel(const Stages& stages, int rank, int world_size) {
  const auto sequence = stages.template find<sequence_parallel_stage>();
  const auto tensor = stages.template find<tensor_parallel_stage>();
  const std::size_t sequence_size = sequence ? sequence->settings().size : 1;
  const std::size_t tensor_size = tensor ? tensor->settings().size : 1;
  // Each at most the world (an int) before they are multiplied, so the product cannot wrap.
  if (sequence_size > static_cast<std::size_t>(world_size) || tensor_size > static_cast<std::size_t>(world_size))
    return {rank, world_size};
  return detail::data_parallel_in_groups(sequence_size * tensor_size, rank, world_size);
}

}  // namespace loom

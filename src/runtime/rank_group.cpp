#include <loom/runtime/rank_group.hpp>

#include "backends.hpp"

#include <loom/base/text.hpp>
#include <loom/runtime/agreement.hpp>
#include <loom/runtime/runtime.hpp>

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <cstdint>
#include <span>
#include <stdexcept>

namespace loom {

rank_group::rank_group(const runtime& rt, int size, rank_group_kind kind)
    : kind_(kind), rank_(rt.rank()), world_size_(rt.world_size()), size_(size) {
  const std::uint64_t asked = fnv1a(std::to_string(size));
  require_agreement(
      rt, fmt::format("{}_group", kind_.name), std::span(&asked, 1),
      [&](std::size_t) { return fmt::format("{} groups of {}", kind_.name, counted(size, "rank")); },
      [&](const disagreement& d) {
        return error_message("{}: rank 0 asks for {} and rank {} for {}: every rank must build the same plan",
                             kind_.stage, d.rank0_item, d.rank, d.other_item);
      });
  if (size < 1 || world_size_ % size != 0) {
    throw_error<std::invalid_argument>(
        "{}({}) does not divide the world of {}: give a size that divides it (the ranks split into groups of that "
        "many, each splitting {}), or start {}",
        kind_.stage, size, counted(world_size_, "rank"), kind_.shares,
        size < 1 ? std::string("with size 1 or more") : fmt::format("a multiple of {} ranks", size));
  }
  // A communicator of its own even over the whole world: under NCCL each communicator is one stream,
  // and on the world's the group's collectives, which the forward waits on, would queue behind the
  // gathers and reduce-scatters that fsdp() prefetches there.
  if (size_ == 1) {
    comm_ = std::make_unique<collectives>(nullptr, 0, 1);
    return;
  }
  const std::int64_t generation = next_mesh_generation(rt);
  comm_ = make_group(rt, generation, name(), ranks(), rank());
  if (rt.backend() == backend_kind::nccl) {
    host_ = make_group(rt, generation, name() + ".host", ranks(), rank(), /*on_host=*/true);
  }
}

rank_group::~rank_group() = default;

std::string rank_group::name() const { return fmt::format("{}.{}", kind_.name, data_rank()); }
std::string rank_group::role() const { return fmt::format("{}[{}]", kind_.name, size_); }

std::vector<int> rank_group::ranks() const {
  std::vector<int> ranks;
  for (int r = 0; r < size_; ++r) ranks.push_back(data_rank() * size_ + r);
  return ranks;
}

}  // namespace loom

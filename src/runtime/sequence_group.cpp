#include <loom/runtime/sequence_group.hpp>

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

sequence_group::sequence_group(const runtime& rt, int size)
    : rank_(rt.rank()), world_size_(rt.world_size()), size_(size) {
  const std::uint64_t asked = fnv1a(std::to_string(size));
  require_agreement(
      rt, "sequence_group", std::span(&asked, 1),
      [&](std::size_t) { return "sequence groups of " + counted(size, "rank"); },
      [&](const disagreement& d) {
        return error_message(
            "sequence_parallel: rank 0 asks for {} and rank {} for {}: every rank must build the same plan",
            d.rank0_item, d.rank, d.other_item);
      });
  if (size < 1 || world_size_ % size != 0) {
    throw_error<std::invalid_argument>(
        "sequence_parallel({}) does not divide the world of {}: give a size that divides it (the ranks split into "
        "groups of that many, each splitting one sequence), or start {}",
        size, counted(world_size_, "rank"),
        size < 1 ? std::string("with size 1 or more") : fmt::format("a multiple of {} ranks", size));
  }
  // A communicator of its own even over the whole world: under NCCL each communicator is one stream,
  // and on the world's the all-to-alls, which the forward waits on, would queue behind the gathers
  // and reduce-scatters that fsdp() prefetches there.
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

sequence_group::~sequence_group() = default;

std::string sequence_group::name() const { return fmt::format("sequence.{}", data_rank()); }
std::string sequence_group::role() const { return fmt::format("sequence[{}]", size_); }

std::vector<int> sequence_group::ranks() const {
  std::vector<int> ranks;
  for (int r = 0; r < size_; ++r) ranks.push_back(data_rank() * size_ + r);
  return ranks;
}

}  // namespace loom

#include <loom/runtime/mesh.hpp>

#include "backends.hpp"

#include <loom/base/text.hpp>
#include <loom/runtime/agreement.hpp>
#include <loom/runtime/host_reads.hpp>
#include <loom/runtime/runtime.hpp>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstdint>
#include <stdexcept>

namespace loom {

std::int64_t next_mesh_generation(const runtime& rt) {
  // Rank 0 counts the meshes in the rendezvous store and tells the others, so that two meshes never
  // share a group's keys.
  at::Tensor generation = at::zeros({1}, at::kLong);
  if (rt.rank() == 0) generation.fill_(rt.store()->add("loom/meshes", 1));
  rt.host_comm().broadcast(generation, 0).wait();
  return host_value<std::int64_t>(generation);
}

std::unique_ptr<collectives> make_group(const runtime& rt, std::int64_t generation, const std::string& name,
                                        std::vector<int> members, int rank, bool on_host) {
  const bool nccl = !on_host && rt.backend() == backend_kind::nccl;
  const bool staged = !nccl && !on_host && rt.device().is_cuda();
  const int size = static_cast<int>(members.size());
  auto store = c10::make_intrusive<c10d::PrefixStore>(fmt::format("loom/mesh.{}/{}", generation, name), rt.store());
  collective_group group{name, std::move(members)};
#ifdef LOOM_HAVE_NCCL
  if (nccl) {
    return std::make_unique<collectives>(make_nccl(store, rt.env(), rank, size, name, rt.device(), rt.failures()), rank,
                                         size, staged, &rt.progress(), std::move(group));
  }
#endif
  return std::make_unique<collectives>(make_gloo(store, rt.env(), rank, size, rt.failures()), rank, size, staged,
                                       &rt.progress(), std::move(group));
}

rank_mesh::rank_mesh(const runtime& rt, int shard_size)
    : rank_(rt.rank()), shard_size_(shard_size), replicate_size_(1) {
  const std::uint64_t asked = fnv1a(std::to_string(shard_size));
  require_agreement(
      rt, "mesh", std::span(&asked, 1), [&](std::size_t) { return "shard groups of " + counted(shard_size, "rank"); },
      [&](const disagreement& d) {
        return error_message(
            "hybrid sharding: rank 0 asks for {} and rank {} for {}: every rank must ask for the same shard group "
            "size",
            d.rank0_item, d.rank, d.other_item);
      });
  const int world = rt.world_size();
  if (shard_size < 1 || world % shard_size != 0) {
    throw_error<std::invalid_argument>(
        "hybrid sharding: a shard group of {} ranks {} the world size {}: choose a divisor of it (the ranks of a "
        "node, LOCAL_WORLD_SIZE, is the usual one)",
        shard_size, shard_size < 1 ? "cannot divide" : "does not divide", world);
  }
  replicate_size_ = world / shard_size;
  if (replicate_size_ == 1) {
    shard_ = &rt.comm();
    replicate_ = std::make_unique<collectives>(nullptr, 0, 1);
    return;
  }
  const std::int64_t generation = next_mesh_generation(rt);
  // A group's backend is made by its members, who meet through its own prefix of the store: every
  // rank makes its shard group, then its replicate group, so that the members of each meet in the
  // same phase and none waits on a group its peers have not begun.
  own_shard_ = make_group(rt, generation, shard_group(), shard_ranks(), shard_rank());
  shard_ = own_shard_.get();
  replicate_ = make_group(rt, generation, replicate_group(), replicate_ranks(), shard_index());
}

rank_mesh::~rank_mesh() = default;
rank_mesh::rank_mesh(rank_mesh&&) noexcept = default;
rank_mesh& rank_mesh::operator=(rank_mesh&&) noexcept = default;

std::string rank_mesh::shard_group() const { return fmt::format("shard.{}", shard_index()); }
std::string rank_mesh::replicate_group() const { return fmt::format("replicate.{}", shard_rank()); }

std::string rank_mesh::shard_role() const {
  return replicate_size_ == 1 ? std::string("world") : fmt::format("shard[{}]", shard_size_);
}
std::string rank_mesh::replicate_role() const { return fmt::format("replicate[{}]", replicate_size_); }

std::vector<int> rank_mesh::shard_ranks() const {
  std::vector<int> ranks;
  for (int r = 0; r < shard_size_; ++r) ranks.push_back(shard_index() * shard_size_ + r);
  return ranks;
}

std::vector<int> rank_mesh::replicate_ranks() const {
  std::vector<int> ranks;
  for (int g = 0; g < replicate_size_; ++g) ranks.push_back(g * shard_size_ + shard_rank());
  return ranks;
}

}  // namespace loom

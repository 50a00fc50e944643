// rank_mesh (loom/runtime/mesh.hpp) across real processes: each rank's shard and replicate groups,
// their members and names, collectives that stay inside them, every divisor of the world size, and
// the refusals on every rank (a size that does not divide, ranks asking for different sizes).
#include "world.hpp"

#include <loom/runtime/agreement.hpp>
#include <loom/runtime/mesh.hpp>

#include <ATen/ATen.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <numeric>
#include <stdexcept>
#include <vector>

using Catch::Matchers::ContainsSubstring;
using loom::testing::world;

namespace {

// The sum of 1 + each member's world rank, reduced over `comm`.
double summed_over(loom::collectives& comm) {
  at::Tensor value = at::full({1}, static_cast<double>(world().rank() + 1), at::kDouble);
  comm.all_reduce(value).wait();
  return value.item<double>();
}

double expected_sum(const std::vector<int>& ranks) {
  return std::accumulate(ranks.begin(), ranks.end(), 0.0, [](double sum, int rank) { return sum + rank + 1; });
}

}  // namespace

TEST_CASE("every divisor of the world size makes consecutive shard groups and strided replicate groups", "[mesh]") {
  const int ranks = world().world_size();
  const int rank = world().rank();
  for (int shard_size = 1; shard_size <= ranks; ++shard_size) {
    if (ranks % shard_size != 0) continue;
    CAPTURE(shard_size);
    const loom::rank_mesh mesh(world(), shard_size);
    CHECK(mesh.shard_size() == shard_size);
    CHECK(mesh.replicate_size() == ranks / shard_size);
    CHECK(mesh.shard_index() == rank / shard_size);
    CHECK(mesh.shard_rank() == rank % shard_size);
    CHECK(mesh.shard_group() == "shard." + std::to_string(rank / shard_size));
    CHECK(mesh.replicate_group() == "replicate." + std::to_string(rank % shard_size));
    // The schedule's names, the same on every rank; a group of every rank is the world's own.
    CHECK(mesh.shard_role() == (shard_size == ranks ? "world" : "shard[" + std::to_string(shard_size) + "]"));
    CHECK(mesh.replicate_role() == "replicate[" + std::to_string(ranks / shard_size) + "]");
    if (shard_size == ranks) CHECK(&mesh.shard() == &world().comm());
    std::vector<int> shard_members(static_cast<std::size_t>(shard_size));
    std::iota(shard_members.begin(), shard_members.end(), rank / shard_size * shard_size);
    CHECK(mesh.shard_ranks() == shard_members);
    std::vector<int> replicate_members;
    for (int r = rank % shard_size; r < ranks; r += shard_size) replicate_members.push_back(r);
    CHECK(mesh.replicate_ranks() == replicate_members);
    CHECK(mesh.shard().world_size() == shard_size);
    CHECK(mesh.shard().rank() == mesh.shard_rank());
    CHECK(mesh.replicate().world_size() == ranks / shard_size);
    CHECK(mesh.replicate().rank() == mesh.shard_index());
    // Reduced inside each group only: each group's sum is its own members'.
    CHECK(summed_over(mesh.shard()) == expected_sum(shard_members));
    CHECK(summed_over(mesh.replicate()) == expected_sum(replicate_members));
  }
}

TEST_CASE("a shard group's all-gather and reduce-scatter carry only its members' shards", "[mesh]") {
  const int ranks = world().world_size();
  const int shard_size = ranks % 2 == 0 ? 2 : ranks;
  const loom::rank_mesh mesh(world(), shard_size);
  const at::Tensor mine = at::full({3}, static_cast<double>(world().rank()), at::kDouble);
  at::Tensor gathered = at::empty({3 * shard_size}, at::kDouble);
  mesh.shard().all_gather(mine, gathered).wait();
  for (int r = 0; r < shard_size; ++r) {
    CHECK(gathered.narrow(0, 3 * r, 3)
              .eq(static_cast<double>(mesh.shard_ranks()[static_cast<std::size_t>(r)]))
              .all()
              .item<bool>());
  }
  at::Tensor reduced = at::empty({3}, at::kDouble);
  mesh.shard().reduce_scatter(at::ones({3 * shard_size}, at::kDouble), reduced).wait();
  CHECK(reduced.eq(static_cast<double>(shard_size)).all().item<bool>());
}

TEST_CASE("a shard group size that does not divide the world size is refused on every rank", "[mesh][errors]") {
  const int ranks = world().world_size();
  CHECK_THROWS_WITH(loom::rank_mesh(world(), ranks + 1),
                    ContainsSubstring("a shard group of " + std::to_string(ranks + 1) +
                                      " ranks does not divide the world size " + std::to_string(ranks)));
  CHECK_THROWS_AS(loom::rank_mesh(world(), 0), std::invalid_argument);
}

TEST_CASE("ranks that ask for different shard group sizes fail together, naming both", "[mesh][errors]") {
  const int ranks = world().world_size();
  const int asked = world().rank() == 0 ? 1 : ranks;
  CHECK_THROWS_AS(loom::rank_mesh(world(), asked), loom::rank_mismatch);
  try {
    const loom::rank_mesh mesh(world(), asked);
  } catch (const loom::rank_mismatch& error) {
    CHECK_THAT(error.what(),
               ContainsSubstring("rank 0 asks for shard groups of 1 rank and rank 1 for shard groups of " +
                                 std::to_string(ranks) + " ranks"));
  }
}

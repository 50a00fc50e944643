// Every collective on Gloo over loopback, checked against closed forms. loom-run starts one copy
// of this program per rank; Catch2 runs the cases in the same order on every rank.
#include "world.hpp"

#include <ATen/ATen.h>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cstdlib>

using loom::reduce_op;
using loom::testing::world;

namespace {

int rank() { return world().rank(); }
int ranks() { return world().world_size(); }
loom::collectives& comm() { return world().comm(); }

// The job size the launcher asked for: the test fails rather than pass on one rank by mistake.
int expected_world_size() {
  const char* expected = std::getenv("LOOM_TEST_EXPECT_WORLD");
  return expected ? std::atoi(expected) : 0;
}

}  // namespace

TEST_CASE("the job has the launcher's size", "[collectives]") {
  REQUIRE(expected_world_size() > 1);
  CHECK(ranks() == expected_world_size());
  CHECK(world().process_group());
  CHECK(world().backend() == loom::backend_kind::gloo);
}

TEST_CASE("all-reduce sums rank + 1 to N(N+1)/2", "[collectives]") {
  auto dtype = GENERATE(at::kFloat, at::kDouble, at::kLong);
  auto tensor = at::full({5, 3}, rank() + 1, at::TensorOptions().dtype(dtype));
  comm().all_reduce(tensor).wait();
  CHECK(at::all(tensor == ranks() * (ranks() + 1) / 2).item<bool>());
}

TEST_CASE("all-reduce mean pre-divides and sums", "[collectives]") {
  auto tensor = at::full({7}, static_cast<double>(rank() + 1), at::kDouble);
  comm().all_reduce(tensor, reduce_op::mean).wait();
  CHECK(at::allclose(tensor, at::full({7}, (ranks() + 1) / 2.0, at::kDouble)));
}

TEST_CASE("collectives are asynchronous: several in flight, waited for later", "[collectives]") {
  std::vector<at::Tensor> tensors;
  std::vector<loom::pending_collective> pending;
  for (int i = 0; i < 4; ++i) {
    tensors.push_back(at::full({1000}, static_cast<float>(i * (rank() + 1))));
    pending.push_back(comm().all_reduce(tensors.back()));
  }
  for (auto& p : pending) p.wait();
  for (int i = 0; i < 4; ++i) {
    CHECK(at::all(tensors[i] == static_cast<float>(i * ranks() * (ranks() + 1) / 2)).item<bool>());
  }
}

TEST_CASE("broadcast copies the root's tensor everywhere", "[collectives]") {
  int root = GENERATE(0, 1);
  auto tensor = at::full({4, 4}, static_cast<float>(rank() * 10 + 7));
  comm().broadcast(tensor, root).wait();
  CHECK(at::all(tensor == static_cast<float>(root * 10 + 7)).item<bool>());
}

TEST_CASE("all-gather concatenates shards, dropping the padding", "[collectives]") {
  std::int64_t numel = GENERATE(1, 6, 7, 11, 1000);
  const std::int64_t shard_size = comm().shard_numel(numel);
  CAPTURE(numel, shard_size);
  auto shard = at::arange(shard_size, at::kFloat) + 1000.0 * rank();
  auto flat = at::full({numel}, -1.0f);
  comm().all_gather(shard, flat).wait();
  auto index = at::arange(numel, at::kLong);
  auto owner = at::floor_divide(index, shard_size);
  auto expected = (index - owner * shard_size).to(at::kFloat) + 1000.0 * owner.to(at::kFloat);
  CHECK(at::equal(flat, expected));
}

TEST_CASE("reduce-scatter gives each rank its slice of the sum, native and emulated", "[collectives]") {
  bool emulated = GENERATE(false, true);
  std::int64_t numel = GENERATE(1, 6, 7, 11, 1000);
  comm().use_emulated_reduce_scatter(emulated);
  const std::int64_t shard_size = comm().shard_numel(numel);
  CAPTURE(emulated, numel, shard_size);
  auto flat = at::arange(numel, at::kDouble) * (rank() + 1);
  const auto flat_before = flat.clone();
  auto shard = at::full({shard_size}, -1.0, at::kDouble);
  comm().reduce_scatter(flat, shard).wait();
  comm().use_emulated_reduce_scatter(false);

  auto index = at::arange(rank() * shard_size, (rank() + 1) * shard_size, at::kDouble);
  auto expected = at::where(index < numel, index * (ranks() * (ranks() + 1) / 2), at::zeros_like(index));
  CHECK(at::equal(shard, expected));
  CHECK(at::equal(flat, flat_before));  // the input is left as it was
}

TEST_CASE("reduce-scatter mean averages", "[collectives]") {
  const std::int64_t numel = 5;
  auto flat = at::full({numel}, static_cast<double>(rank() + 1), at::kDouble);
  auto shard = at::empty({comm().shard_numel(numel)}, at::kDouble);
  comm().reduce_scatter(flat, shard, reduce_op::mean).wait();
  auto index = at::arange(rank() * shard.numel(), (rank() + 1) * shard.numel(), at::kDouble);
  auto expected = at::where(index < numel, at::full_like(index, (ranks() + 1) / 2.0), at::zeros_like(index));
  CHECK(at::allclose(shard, expected));
}

TEST_CASE("a shard of the wrong size is refused with the sizes", "[collectives]") {
  auto flat = at::zeros({10});
  auto shard = at::zeros({comm().shard_numel(10) + 1});
  CHECK_THROWS_WITH(comm().reduce_scatter(flat, shard), Catch::Matchers::ContainsSubstring("shards of"));
}

TEST_CASE("barrier completes on every rank", "[collectives]") {
  comm().barrier().wait();
  SUCCEED();
}

#include <loom/runtime/tensor_group.hpp>

#include <fmt/format.h>

namespace loom {

namespace {
constexpr rank_group_kind tensor_kind{.stage = "tensor_parallel", .name = "tensor", .shares = "every parallel layer"};
}

tensor_group::tensor_group(const runtime& rt, int size)
    : rank_group(rt, size, tensor_kind), data_parallel_(rt.among(data_parallel_name(), data_parallel_ranks())) {}

std::string tensor_group::data_parallel_name() const { return fmt::format("data.{}", rank()); }

std::vector<int> tensor_group::data_parallel_ranks() const {
  std::vector<int> ranks;
  for (int group = 0; group < data_world_size(); ++group) ranks.push_back(group * size() + rank());
  return ranks;
}

}  // namespace loom

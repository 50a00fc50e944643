#pragma once
// The blocking sums, gathers and reduce-scatters over a group of consecutive ranks that share a model's
// work (sequence_parallel's, tensor_parallel's): what their autograd nodes compute in forward and
// backward. Private to the nn wing.

#include <loom/runtime/rank_group.hpp>

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace loom::nn {

// `part` summed over the group, into a tensor of its own.
inline at::Tensor summed(const rank_group& group, const at::Tensor& part) {
  at::Tensor total = part.contiguous().clone();
  group.comm().all_reduce(total).wait();
  return total;
}

// Each rank's `part` joined along `dim`, in rank order.
inline at::Tensor gathered(const rank_group& group, const at::Tensor& part, std::int64_t dim) {
  const at::Tensor moved = part.movedim(dim, 0).contiguous();
  std::vector<std::int64_t> sizes = moved.sizes().vec();
  sizes[0] *= group.size();
  at::Tensor whole = at::empty(sizes, moved.options());
  at::Tensor flat = whole.view(-1);
  group.comm().all_gather(moved.view(-1), flat).wait();
  return whole.movedim(0, dim);
}

// `whole` summed over the group, this rank's part of it along `dim` kept.
inline at::Tensor scattered(const rank_group& group, const at::Tensor& whole, std::int64_t dim) {
  const at::Tensor moved = whole.movedim(dim, 0).contiguous();
  std::vector<std::int64_t> sizes = moved.sizes().vec();
  sizes[0] /= group.size();
  at::Tensor part = at::empty(sizes, moved.options());
  at::Tensor flat = part.view(-1);
  group.comm().reduce_scatter(moved.view(-1), flat).wait();
  return part.movedim(0, dim);
}

}  // namespace loom::nn

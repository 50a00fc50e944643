#pragma once
// The trainable parameters fsdp() does not shard (LoRA's adapters over a frozen, sharded base):
// replicated on every rank, identical at creation, their gradients averaged after backward bucket by
// bucket in name order: a rank that did not use an adapter contributes zeros, so that every rank
// issues the same all-reduces, and every adapter ends the backward with the mean. A bucket holds the
// adapters of one branch (loom/nn/branch.hpp), or of none, so that a pass reduces the branch it took.

#include <loom/nn/branch.hpp>
#include <loom/runtime/collectives.hpp>
#include <loom/runtime/tensors.hpp>
#include <loom/schedule/schedule.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace loom::sharding {

class replicated_adapters {
 public:
  replicated_adapters() = default;
  // `reduce`: what the gradients are averaged in (mixed precision's); none: their own dtype.
  // `branches`: the model's, which the buckets keep apart.
  replicated_adapters(std::vector<named_tensor> adapters, std::int64_t bucket_cap_bytes,
                      std::optional<at::ScalarType> reduce = std::nullopt,
                      const std::vector<nn::branch_module>& branches = {});

  // Sorted by branch (in registration order, then those in none), then by name.
  [[nodiscard]] const std::vector<named_tensor>& tensors() const noexcept { return adapters_; }
  [[nodiscard]] std::size_t bucket_count() const noexcept { return buckets_.size(); }
  // The index of the branch whose adapters the bucket holds; the branches' count for none.
  [[nodiscard]] std::size_t bucket_branch(std::size_t bucket) const noexcept { return buckets_[bucket].branch; }
  [[nodiscard]] schedule_entry bucket_entry(std::size_t bucket) const;

  // Packs the bucket's gradients and issues their mean, without waiting.
  void start_all_reduce(std::size_t bucket, collectives& comm);
  // Waits for what was issued and sets each adapter's gradient to its mean: the bucket's bytes when
  // the dtypes agree (no copy), through a tensor that is not an autograd view of them, so that
  // LibTorch's Optimizer::zero_grad can detach it in place. Every all-reduce packs a new bucket, so
  // no collective writes a gradient handed out.
  void finish_all_reduces();

 private:
  struct bucket {
    std::vector<std::size_t> members;  // indices into adapters_
    std::size_t branch = 0;
    std::string branch_name;  // empty for none
  };
  struct reduction {
    std::size_t bucket;
    at::Tensor packed;
    pending_collective work;
  };
  [[nodiscard]] at::ScalarType reduce_dtype(std::size_t bucket) const;

  std::vector<named_tensor> adapters_;
  std::optional<at::ScalarType> reduce_;
  std::vector<bucket> buckets_;
  std::vector<reduction> in_flight_;
};

}  // namespace loom::sharding

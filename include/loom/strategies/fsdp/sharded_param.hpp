#pragma once
// One parameter under fsdp(): sharded on dim 0 across the N ranks of a shard group at rest (every
// rank, or under hybrid sharding a group of them), whole around its unit's forward and backward
// (FSDP2's per-parameter part). The group's rank r owns rows [r·s, min(rows, (r+1)·s)),
// s = ceil(rows / N), kept as s rows, zero-padded past the end, flat; a 0-d parameter counts as one
// row. Collectives carry a parameter rank-major: N blocks of s rows, one per rank. Every `rank`
// below is a rank within the shard group.
//
// Under mixed precision (FSDP2's) the shard keeps the parameter's dtype and is the master copy the
// optimizer steps, while the module's parameter (full) is held in the compute dtype: gathers carry
// and write that, and its gradient is reduced in the reduce dtype and added to the shard's in its own.
//
// Offloaded (fsdp_options::offload, FSDP2's CPUOffloadPolicy) the shard and its gradient live in
// pinned host memory while the full parameter stays on the device: a gather copies the shard in,
// and each reduced gradient is copied out without blocking, for the host to take once it has waited
// for the device (settle_grad).

#include <loom/nn/deferred_init.hpp>
#include <loom/runtime/tensors.hpp>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace loom::sharding {

class sharded_param {
 public:
  // A shard of its own, zero, for a rank's rows of `parameter` (of `ranks`); `parameter` must
  // own its storage, all of it, or none (constructed without its bytes). Its rows come through
  // rows_request; then release_full: from then on the parameter is held in `compute` (a floating
  // parameter under mixed precision) or in its own dtype (none). `offload`: the shard in pinned host
  // memory rather than on the parameter's device.
  sharded_param(std::string name, at::Tensor parameter, int ranks, std::optional<at::ScalarType> compute = std::nullopt,
                bool offload = false);

  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  // The module's parameter: its identity, full shape and autograd metadata stay; its bytes do not.
  [[nodiscard]] const at::Tensor& full() const noexcept { return full_; }
  // This rank's rows, flat: what the optimizer steps.
  [[nodiscard]] const at::Tensor& shard() const noexcept { return shard_; }
  [[nodiscard]] bool trainable() const noexcept { return trainable_; }
  [[nodiscard]] std::int64_t shard_numel() const noexcept { return shard_rows_ * row_numel_; }
  // Whether the shard lives in host memory, away from the full parameter's device.
  [[nodiscard]] bool offloaded() const noexcept { return offloaded_; }

  // Whether the full parameter holds its bytes (whole), or none (at rest).
  [[nodiscard]] bool allocated() const noexcept;
  // Frees the full parameter's bytes, and gives it new, unwritten ones through its storage's own
  // allocator (the device's: no copy, no host code): N × shard_numel() elements, the full parameter
  // and its padding past the last row, as FSDP2 pads, so that a gather writes it in one piece. Only a
  // whole parameter is freed and only one at rest is given bytes; anything else is a bug in the
  // caller (an internal error).
  void free_storage() const;
  void alloc_storage() const;

  // Where a gather writes the whole parameter, rank-major: N × shard_numel(), over the bytes
  // alloc_storage() gave it (the full parameter's rows, then the padding).
  [[nodiscard]] at::Tensor gathered_rows() const;
  // Every rank's rows as a new whole tensor of the shard's dtype on the full parameter's device (the
  // master weights, gathered).
  [[nodiscard]] at::Tensor whole_from(const at::Tensor& by_rank) const;
  // The full parameter's rows and each row's elements: the gradient's shape in a reduce-scatter.
  [[nodiscard]] std::int64_t rows() const noexcept { return rows_; }
  [[nodiscard]] std::int64_t row_numel() const noexcept { return row_numel_; }
  // The full parameter's gradient, with what stash_grad kept of earlier backwards, as rows() ×
  // row_numel(), dropped from the parameter; undefined when there is none.
  [[nodiscard]] at::Tensor take_grad();
  // Between the backwards of unsharded accumulation: moves the full parameter's gradient into a
  // gradient of `reduce`'s dtype, when it is computed narrower, so that the micro-batches add up in
  // `reduce` rather than in the compute dtype.
  void stash_grad(at::ScalarType reduce);
  // Adds this rank's reduced gradient (shard_numel() elements) to the shard's, in the shard's dtype;
  // a shard without a gradient takes `reduced`'s bytes as its gradient when the dtypes agree, through
  // a tensor that is not an autograd view of them (LibTorch's Optimizer::zero_grad detaches each
  // gradient in place, which a view refuses). No collective writes those bytes again.
  // Offloaded: `reduced` (on the device) is copied into pinned host memory by a non-blocking copy on
  // the current stream, as the shard's gradient when it has none, else beside it; the host reads
  // neither until settle_grad().
  void accumulate_grad(const at::Tensor& reduced) const;
  // Offloaded, once the host has waited for the device's copies: adds what accumulate_grad copied
  // beside an existing gradient into it. Nothing otherwise.
  void settle_grad() const;
  // Around a change made to the whole parameters (merge, loading weights): the full parameter holds
  // `whole`, the master weights of the shard's dtype; then this rank's rows of it go back into the
  // shard and the full parameter is at rest again, in the compute dtype.
  void hold_whole(const at::Tensor& whole) const;
  void release_whole(int rank) const;
  // Takes this rank's rows of the full parameter's current values (after a change made to it whole).
  void reshard_values(int rank) const;
  // Rank `rank`'s rows of the parameter, to be written into the shard (converted to its dtype); none
  // when the rank owns no rows.
  [[nodiscard]] std::optional<nn::row_request> rows_request(int rank) const;
  // The full parameter without its bytes, in the compute dtype: at rest.
  void release_full() const;
  // This rank's rows, flat and padded as shard() is, of a tensor laid out as this parameter but
  // sharded over another number of ranks: `shards` are those ranks' flat shards, in rank order.
  [[nodiscard]] at::Tensor rows_from_shards(const std::vector<at::Tensor>& shards, int rank) const;

 private:
  struct row_range {
    std::int64_t first = 0;
    std::int64_t count = 0;  // fewer than shard rows for the last ranks, or none
  };
  // The rows of the full parameter that rank `rank` owns.
  [[nodiscard]] row_range rows_of(int rank) const noexcept;
  // The full parameter as rows × row_numel, sharing its storage but not its version counter, so that
  // writing a gather into it does not invalidate what autograd saved for backward.
  [[nodiscard]] at::Tensor full_rows() const;

  std::string name_;
  at::Tensor full_;
  at::Tensor shard_;
  at::ScalarType compute_dtype_ = at::kFloat;  // what the full parameter is held in
  at::Tensor stashed_grad_;                    // no_sync's gradients so far, in the reduce dtype (stash_grad)
  mutable at::Tensor landing_grad_;            // offloaded: a reduced gradient copied out, to add (settle_grad)
  std::int64_t rows_ = 1;
  std::int64_t row_numel_ = 1;
  std::int64_t shard_rows_ = 1;
  std::int64_t ranks_ = 1;
  bool trainable_ = false;
  bool offloaded_ = false;
};

}  // namespace loom::sharding

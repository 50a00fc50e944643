#pragma once
// Gradients packed for one reduction, each with a used-flag: what fsdp()'s reduce-scatters and its
// replicated adapters' all-reduces both send. A tensor that has no gradient on this rank sends zeros
// and a flag of 0, so that, after the mean over the ranks, a tensor some rank used gets its reduced
// gradient and one that no rank used keeps none, as under local().
//
// The packed buffer is rows × (Σ sizes + one flag a tensor): one row for an all-reduce, one a rank
// for a reduce-scatter, whose every row carries all the flags so that each rank's reduced row has them.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace loom::sharding {

class flagged_gradients {
 public:
  flagged_gradients() = default;
  // `sizes`: each tensor's elements in one row.
  explicit flagged_gradients(std::vector<std::int64_t> sizes);

  [[nodiscard]] std::size_t count() const noexcept { return sizes_.size(); }
  // Σ sizes and the flags.
  [[nodiscard]] std::int64_t row_numel() const noexcept { return flags_at_ + static_cast<std::int64_t>(count()); }

  // A rows × row_numel() buffer of zeros, with write(k, tensor k's rows × sizes[k] slice) called for
  // each tensor: it fills the slice and says whether this rank had a gradient (the flag).
  [[nodiscard]] at::Tensor pack(std::int64_t rows, const at::TensorOptions& options,
                                const std::function<bool(std::size_t, const at::Tensor&)>& write) const;
  // For one reduced row (row_numel() elements): read(k, tensor k's sizes[k] elements) for each tensor
  // some rank had a gradient for. The flags are read on the host: a few numbers.
  void unpack(const at::Tensor& reduced, const std::function<void(std::size_t, const at::Tensor&)>& read) const;

 private:
  std::vector<std::int64_t> sizes_;
  std::vector<std::int64_t> offsets_;
  std::int64_t flags_at_ = 0;
};

}  // namespace loom::sharding

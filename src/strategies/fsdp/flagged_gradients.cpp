#include <loom/strategies/fsdp/flagged_gradients.hpp>

#include <ATen/ATen.h>

#include <utility>

namespace loom::sharding {

flagged_gradients::flagged_gradients(std::vector<std::int64_t> sizes) : sizes_(std::move(sizes)) {
  for (const std::int64_t size : sizes_) {
    offsets_.push_back(flags_at_);
    flags_at_ += size;
  }
}

at::Tensor flagged_gradients::pack(std::int64_t rows, const at::TensorOptions& options,
                                   const std::function<bool(std::size_t, const at::Tensor&)>& write) const {
  const at::Tensor packed = at::zeros({rows, row_numel()}, options);
  for (std::size_t k = 0; k < count(); ++k) {
    if (write(k, packed.narrow(1, offsets_[k], sizes_[k]))) {
      packed.select(1, flags_at_ + static_cast<std::int64_t>(k)).fill_(1);
    }
  }
  return packed;
}

void flagged_gradients::unpack(const at::Tensor& reduced,
                               const std::function<void(std::size_t, const at::Tensor&)>& read) const {
  const auto flags = static_cast<std::int64_t>(count());
  const at::Tensor used_by = reduced.narrow(0, flags_at_, flags).to(at::kDouble).cpu();
  const auto* used = used_by.const_data_ptr<double>();
  for (std::size_t k = 0; k < count(); ++k) {
    if (used[k] > 0) read(k, reduced.narrow(0, offsets_[k], sizes_[k]));
  }
}

}  // namespace loom::sharding

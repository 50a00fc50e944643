#include <loom/strategies/buckets.hpp>

namespace loom {

std::vector<std::vector<std::size_t>> assign_buckets(const std::vector<named_tensor>& tensors,
                                                     std::span<const std::size_t> order,
                                                     const std::function<std::int64_t(std::size_t bucket)>& cap) {
  std::vector<std::vector<std::size_t>> buckets;
  std::int64_t filled = 0;
  for (std::size_t i : order) {
    const at::Tensor& t = tensors[i].tensor;
    const bool fits = !buckets.empty() && filled < cap(buckets.size() - 1) &&
                      tensors[buckets.back().front()].tensor.scalar_type() == t.scalar_type();
    if (!fits) {
      buckets.emplace_back();
      filled = 0;
    }
    buckets.back().push_back(i);
    filled += static_cast<std::int64_t>(t.nbytes());
  }
  return buckets;
}

}  // namespace loom

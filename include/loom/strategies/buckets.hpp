#pragma once
// Buckets: tensors packed into one collective each, as PyTorch's DDP packs its gradients.

#include <loom/runtime/tensors.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace loom {

// Indices into `tensors`, taken in `order`, grouped into buckets of one dtype each; bucket b closes
// once it holds cap(b) bytes or more, and the next tensor starts a new one.
[[nodiscard]] std::vector<std::vector<std::size_t>> assign_buckets(
    const std::vector<named_tensor>& tensors, std::span<const std::size_t> order,
    const std::function<std::int64_t(std::size_t bucket)>& cap);

}  // namespace loom

#pragma once
// What the runtime does with a plan's dtypes (docs/precision.md): default_dtype(...) around the
// model's construction, and mixed_precision(...) as a policy in LibTorch's dtypes, which the job
// applies around the forward (torch.autocast, for an engine that does not cast parameters itself)
// and a casting engine, fsdp(), reads for its gathers and reductions.

#include <loom/dsl/dtype.hpp>
#include <loom/dsl/mixed_precision.hpp>

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <c10/util/typeid.h>

#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace torch::nn {
class Module;
}

namespace loom {

[[nodiscard]] at::ScalarType scalar_type(dtype type) noexcept;

// mixed_precision(...) in LibTorch's dtypes.
struct precision_policy {
  at::ScalarType param = at::kBFloat16;
  at::ScalarType reduce = at::kFloat;
  std::optional<at::ScalarType> output;
  bool cast_forward_inputs = true;

  [[nodiscard]] static precision_policy from(const mixed_precision_options& options) noexcept;
  // What a parameter of `original` dtype computes in: param for a floating one, else its own.
  [[nodiscard]] at::ScalarType compute_dtype(at::ScalarType original) const noexcept;
};

// Runs a scope with LibTorch's default dtype set to `type` (none: left as it is), restoring the
// previous one at its end: the dtype the model's constructor builds its parameters in.
class [[nodiscard]] default_dtype_scope {
 public:
  explicit default_dtype_scope(std::optional<dtype> type);
  ~default_dtype_scope();
  default_dtype_scope(const default_dtype_scope&) = delete;
  default_dtype_scope& operator=(const default_dtype_scope&) = delete;

 private:
  std::optional<caffe2::TypeMeta> saved_;
};

// Every parameter of `module` that trains and was built narrower than fp32 becomes fp32 (the same
// tensor, new bytes): the master copy the optimizer steps. Returns how many it changed.
std::size_t hold_trainable_in_fp32(torch::nn::Module& module);

// torch.autocast(device, dtype) for a scope: LibTorch's op lists cast each op's inputs (matmuls to
// the lower precision, losses and the rest of the device's fp32 list to fp32).
class [[nodiscard]] autocast_scope {
 public:
  autocast_scope(c10::DeviceType device, at::ScalarType type);
  ~autocast_scope();
  autocast_scope(const autocast_scope&) = delete;
  autocast_scope& operator=(const autocast_scope&) = delete;

 private:
  c10::DeviceType device_;
  bool was_enabled_;
  at::ScalarType was_type_;
  bool was_caching_;
};

// A floating tensor cast to `type`; anything else (integers, a tensor of indices) as it is.
[[nodiscard]] at::Tensor cast_floating(const at::Tensor& value, std::optional<at::ScalarType> type);

namespace detail {
template <class T>
inline constexpr bool is_pair_or_tuple = false;
template <class... T>
inline constexpr bool is_pair_or_tuple<std::tuple<T...>> = true;
template <class A, class B>
inline constexpr bool is_pair_or_tuple<std::pair<A, B>> = true;
}  // namespace detail

// The floating tensors in `value` (a tensor, or a tuple or pair of values) cast to `type`; the rest,
// and everything when `type` is none, passed through as it came.
template <class T>
[[nodiscard]] decltype(auto) cast_floating(T&& value, std::optional<at::ScalarType> type) {
  using V = std::remove_cvref_t<T>;
  if constexpr (std::is_same_v<V, at::Tensor>) {
    return cast_floating(static_cast<const at::Tensor&>(value), type);
  } else if constexpr (detail::is_pair_or_tuple<V>) {
    return std::apply([&](const auto&... each) { return V(cast_floating(each, type)...); }, value);
  } else {
    return std::forward<T>(value);
  }
}

}  // namespace loom

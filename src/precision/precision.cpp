#include <loom/precision/precision.hpp>

#include <loom/nn/deferred_init.hpp>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/GradMode.h>
#include <torch/nn/module.h>

namespace loom {

at::ScalarType scalar_type(dtype type) noexcept {
  switch (type) {
    case dtype::float32: return at::kFloat;
    case dtype::bfloat16: return at::kBFloat16;
    case dtype::float16: return at::kHalf;
    case dtype::float64: return at::kDouble;
    case dtype::int64: return at::kLong;
    case dtype::int32: return at::kInt;
    case dtype::int16: return at::kShort;
    case dtype::int8: return at::kChar;
    case dtype::uint8: return at::kByte;
    case dtype::boolean: return at::kBool;
  }
  return at::kFloat;
}

precision_policy precision_policy::from(const mixed_precision_options& options) noexcept {
  return {scalar_type(options.param), scalar_type(options.reduce),
          options.output ? std::optional(scalar_type(*options.output)) : std::nullopt, options.cast_forward_inputs};
}

at::ScalarType precision_policy::compute_dtype(at::ScalarType original) const noexcept {
  return at::isFloatingType(original) ? param : original;
}

default_dtype_scope::default_dtype_scope(std::optional<dtype> type) {
  if (!type) return;
  saved_ = c10::get_default_dtype();
  c10::set_default_dtype(c10::scalarTypeToTypeMeta(scalar_type(*type)));
}

default_dtype_scope::~default_dtype_scope() {
  if (saved_) c10::set_default_dtype(*saved_);
}

std::size_t hold_trainable_in_fp32(torch::nn::Module& module) {
  c10::NoGradGuard no_grad;
  std::size_t changed = 0;
  for (at::Tensor& parameter : module.parameters()) {
    const at::ScalarType type = parameter.scalar_type();
    if (!parameter.requires_grad() || !at::isReducedFloatingType(type)) continue;
    if (nn::has_bytes(parameter)) {
      parameter.set_data(parameter.detach().to(at::kFloat));
    } else {  // constructed without its bytes: its values come in fp32 (loom/nn/deferred_init.hpp)
      nn::drop_bytes(parameter, at::kFloat, parameter.device());
    }
    ++changed;
  }
  return changed;
}

autocast_scope::autocast_scope(c10::DeviceType device, at::ScalarType type)
    : device_(device),
      was_enabled_(at::autocast::is_autocast_enabled(device)),
      was_type_(at::autocast::get_autocast_dtype(device)),
      was_caching_(at::autocast::is_autocast_cache_enabled()) {
  at::autocast::set_autocast_enabled(device, true);
  at::autocast::set_autocast_dtype(device, type);
  at::autocast::increment_nesting();
  at::autocast::set_autocast_cache_enabled(true);
}

autocast_scope::~autocast_scope() {
  // As torch.autocast's __exit__: the weight casts cached for this forward go with the outermost scope.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_, was_enabled_);
  at::autocast::set_autocast_dtype(device_, was_type_);
  at::autocast::set_autocast_cache_enabled(was_caching_);
}

at::Tensor cast_floating(const at::Tensor& value, std::optional<at::ScalarType> type) {
  if (!type || !value.defined() || !at::isFloatingType(value.scalar_type()) || value.scalar_type() == *type)
    return value;
  return value.to(*type);
}

}  // namespace loom

// default_dtype(t): the model is built in t (torch.set_default_dtype around its construction, as the
// seed's build_replicated_model_from_scratch takes default_dtype), so that a frozen base can be held
// in bf16. When t is narrower than fp32, what trains is held in fp32 all the same, as PEFT keeps its
// adapters (autocast_adapter_dtype): the optimizer's master copy. It is a stage of its own, not an option of seeded,
// because a plan without seeded builds its model too.
#pragma once

#include <loom/dsl/describe.hpp>
#include <loom/dsl/diagnostics.hpp>
#include <loom/dsl/dtype.hpp>
#include <loom/dsl/pipe.hpp>
#include <loom/dsl/stage_kind.hpp>

#include <string>
#include <string_view>

namespace loom {

class default_dtype_stage : public detail::pipeable {
 public:
  static constexpr stage_kind kind = stage_kind::default_dtype;
  static constexpr std::string_view name = "default_dtype";

  // For values known only at run time: R17's value check, throwing plan_error.
  static constexpr default_dtype_stage checked(dtype type) {
    detail::enforce(is_floating(type) ? violation::none : violation::r17_not_floating);
    return default_dtype_stage(type);
  }

  [[nodiscard]] constexpr dtype type() const noexcept { return type_; }
  [[nodiscard]] std::string options() const { return detail::to_text(type_); }
  [[nodiscard]] std::string describe() const { return detail::call_text(name, options()); }

 private:
  constexpr explicit default_dtype_stage(dtype type) noexcept : type_(type) {}

  dtype type_;
};

// A constant dtype, checked while compiling: default_dtype(loom::bf16).
consteval default_dtype_stage default_dtype(dtype type) { return default_dtype_stage::checked(type); }

}  // namespace loom

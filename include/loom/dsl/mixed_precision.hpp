// mixed_precision(options): forward and backward in a narrower dtype over full-precision master
// weights, gradients reduced in `reduce` (FSDP2's MixedPrecisionPolicy; torch.autocast under local()
// and ddp()). docs/precision.md says what each strategy does with it.
#pragma once

#include <loom/dsl/describe.hpp>
#include <loom/dsl/diagnostics.hpp>
#include <loom/dsl/dtype.hpp>
#include <loom/dsl/options.hpp>
#include <loom/dsl/pipe.hpp>
#include <loom/dsl/stage_kind.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <tuple>

namespace loom {

// Named as FSDP2's MixedPrecisionPolicy names them (param_dtype, reduce_dtype, output_dtype,
// cast_forward_inputs), without the _dtype.
struct mixed_precision_options {
  dtype param = bf16;               // what forward and backward compute in
  dtype reduce = fp32;              // what gradients are averaged across ranks in
  std::optional<dtype> output{};    // the forward's result cast to it; none: left as computed
  bool cast_forward_inputs = true;  // under fsdp(): the forward's floating tensor arguments cast to param

  static constexpr auto fields() {
    return std::tuple{option_field{"param", &mixed_precision_options::param},
                      option_field{"reduce", &mixed_precision_options::reduce},
                      option_field{"output", &mixed_precision_options::output},
                      option_field{"cast_forward_inputs", &mixed_precision_options::cast_forward_inputs}};
  }
};

// R16: the first value of a mixed_precision(...) that loom refuses, or none.
constexpr violation mixed_precision_violation(const mixed_precision_options& options) noexcept {
  if (!is_floating(options.param)) return violation::r16_param_not_floating;
  if (options.param == fp16) return violation::r16_fp16_without_loss_scaling;
  if (!is_reduced_precision(options.param)) return violation::r16_param_full_precision;
  if (!is_floating(options.reduce)) return violation::r16_reduce_not_floating;
  if (options.output && !is_floating(*options.output)) return violation::r16_output_not_floating;
  return violation::none;
}

class mixed_precision_stage : public detail::pipeable {
 public:
  using options_type = mixed_precision_options;
  static constexpr stage_kind kind = stage_kind::mixed_precision;
  static constexpr std::string_view name = "mixed_precision";

  // For values known only at run time: the checks of mixed_precision(...), throwing plan_error.
  static constexpr mixed_precision_stage checked(const mixed_precision_options& settings) {
    detail::enforce(mixed_precision_violation(settings));
    return mixed_precision_stage(settings);
  }

  [[nodiscard]] constexpr const mixed_precision_options& settings() const noexcept { return settings_; }
  [[nodiscard]] std::string options() const { return options_text(settings_); }
  [[nodiscard]] std::string describe() const { return detail::call_text(name, options()); }

 private:
  constexpr explicit mixed_precision_stage(const mixed_precision_options& settings) : settings_(settings) {}

  mixed_precision_options settings_;
};

// Constant arguments, checked while compiling: mixed_precision() computes in bf16 and reduces in
// fp32; mixed_precision({.output = loom::fp32}). With run-time values use mixed_precision_stage::checked.
consteval mixed_precision_stage mixed_precision(mixed_precision_options settings = {}) {
  return mixed_precision_stage::checked(settings);
}

}  // namespace loom

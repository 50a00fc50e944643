// loom 0.1.0's plan accessors, one per stage, kept deprecated through 0.2.0 so that a program written
// against them still compiles: each is now a call of find<S>(), which its warning names. They go in
// 0.3.0 (docs/changes.md).
#pragma once

#include <loom/dsl/default_dtype.hpp>
#include <loom/dsl/dtype.hpp>
#include <loom/dsl/lora.hpp>
#include <loom/dsl/mixed_precision.hpp>
#include <loom/dsl/pretrained.hpp>
#include <loom/dsl/recompute.hpp>
#include <loom/dsl/seeded.hpp>
#include <loom/dsl/stage_list.hpp>
#include <loom/dsl/targets.hpp>
#include <loom/dsl/trainable.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>

namespace loom::detail {

// The accessors of Plan (plan<...> or run_plan<...>), read through its find<S>().
template <class Plan>
class deprecated_stage_accessors {
 public:
  // Each declaration below its warning: clang-format 14 would split it after the attribute instead.
  // clang-format off
  [[nodiscard, deprecated("use plan.find<loom::seeded_stage>() and its seed(); seed() goes in loom 0.3.0")]]
  constexpr std::optional<std::uint64_t> seed() const { return read<seeded_stage>(&seeded_stage::seed); }

  // The dtype the model is built in; none: LibTorch's default, fp32.
  [[nodiscard, deprecated("use plan.find<loom::default_dtype_stage>() and its type(); default_dtype() goes in "
                          "loom 0.3.0")]]
  constexpr std::optional<dtype> default_dtype() const { return read<default_dtype_stage>(&default_dtype_stage::type); }

  [[nodiscard, deprecated("use plan.find<loom::mixed_precision_stage>() and its settings(); mixed_precision() goes "
                          "in loom 0.3.0")]]
  constexpr std::optional<mixed_precision_options> mixed_precision() const {
    return read<mixed_precision_stage>(&mixed_precision_stage::settings);
  }

  // The checkpoint the weights come from; none: as the model's constructor (and seeded) made them.
  [[nodiscard, deprecated("use plan.find<loom::pretrained_stage>() and its path(); pretrained() goes in loom 0.3.0")]]
  std::optional<std::string> pretrained() const { return read<pretrained_stage>(&pretrained_stage::path); }

  [[nodiscard, deprecated("use plan.find<loom::recompute_stage>() and its settings(); recompute() goes in loom "
                          "0.3.0")]]
  constexpr std::optional<recompute_options> recompute() const {
    return read<recompute_stage>(&recompute_stage::settings);
  }

  [[nodiscard, deprecated("use plan.find<loom::lora_stage>(); lora() goes in loom 0.3.0")]]
  constexpr std::optional<lora_stage> lora() const { return as_plan().template find<lora_stage>(); }

  // Empty when the plan has no trainable(...).
  [[nodiscard, deprecated("use plan.find<loom::trainable_stage>() and its patterns(); trainable_patterns() goes in "
                          "loom 0.3.0")]]
  constexpr target_list trainable_patterns() const {
    return read<trainable_stage>(&trainable_stage::patterns).value_or(target_list{});
  }
  // clang-format on

 private:
  [[nodiscard]] constexpr const Plan& as_plan() const noexcept { return static_cast<const Plan&>(*this); }

  // `field` of the plan's stage S, if it has one.
  template <PlanStage S, class Field>
  [[nodiscard]] constexpr auto read(Field field) const
      -> std::optional<std::remove_cvref_t<std::invoke_result_t<Field, const S&>>> {
    if (const std::optional<S> stage = as_plan().template find<S>()) return std::invoke(field, *stage);
    return std::nullopt;
  }
};

}  // namespace loom::detail

// tensor_parallel(k): each layer's weights split across a group of k consecutive ranks (Megatron-LM's
// tensor parallelism, FastVideo's tp_size, torchtitan's tp degree). The world becomes k
// tensor-parallel ranks × world / k data-parallel ones; the ranks of one group read the same batch
// and each holds its 1/k of every split layer, and the group's collectives join the partial results.
#pragma once

#include <loom/dsl/describe.hpp>
#include <loom/dsl/diagnostics.hpp>
#include <loom/dsl/options.hpp>
#include <loom/dsl/pipe.hpp>
#include <loom/dsl/sequence_parallel.hpp>
#include <loom/dsl/stage_kind.hpp>
#include <loom/dsl/violation.hpp>

#include <cstddef>
#include <string>
#include <string_view>
#include <tuple>

namespace loom {

struct tensor_parallel_options {
  // The ranks each layer is split across (FastVideo's tp_size, torchtitan's tp degree); 1 splits nothing.
  // A layout option: a checkpoint resumes under another size, resharded.
  std::size_t size = 1;

  static constexpr auto fields() {
    return std::tuple{option_field{"size", &tensor_parallel_options::size, option_role::layout}};
  }
};

class tensor_parallel_stage : public detail::pipeable {
 public:
  using options_type = tensor_parallel_options;
  static constexpr stage_kind kind = stage_kind::tensor_parallel;
  static constexpr std::string_view name = "tensor_parallel";

  // For values known only at run time: the checks of tensor_parallel(...), throwing plan_error.
  static constexpr tensor_parallel_stage checked(const tensor_parallel_options& settings) {
    detail::enforce(settings.size == 0 ? violation::r22_size_zero : violation::none);
    return tensor_parallel_stage(settings);
  }

  [[nodiscard]] constexpr const tensor_parallel_options& settings() const noexcept { return settings_; }
  [[nodiscard]] std::string options() const { return options_text(settings_); }
  [[nodiscard]] std::string describe() const { return detail::call_text(name, options()); }
  // Without the size, which a checkpoint may be resharded across: "tensor_parallel()".
  [[nodiscard]] std::string describe_state() const {
    return detail::call_text(name, options_text(settings_, /*state_only=*/true));
  }

 private:
  constexpr explicit tensor_parallel_stage(const tensor_parallel_options& settings) : settings_(settings) {}

  tensor_parallel_options settings_;
};

// R22 on the values of two stages together: sequence_parallel and tensor_parallel both above 1 split
// the world two ways, which one mesh of ranks does not do yet. `stages` is anything that finds its
// stages by find<S>() (a typed plan, a run file's run_plan, a stage_list); the plan checks it when it
// is made, while compiling for a constant plan.
template <class Stages>
constexpr violation tensor_parallel_violation(const Stages& stages) {
  const auto sequence = stages.template find<sequence_parallel_stage>();
  const auto tensor = stages.template find<tensor_parallel_stage>();
  const bool both_split = sequence && tensor && sequence->settings().size > 1 && tensor->settings().size > 1;
  return both_split ? violation::r22_with_sequence_parallel : violation::none;
}

// Constant arguments, checked while compiling: tensor_parallel(2) splits each layer over two ranks.
// With a run-time value use tensor_parallel_stage::checked.
consteval tensor_parallel_stage tensor_parallel(std::size_t size) {
  return tensor_parallel_stage::checked({.size = size});
}

}  // namespace loom

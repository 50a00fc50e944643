#pragma once
// The seam between a job and its strategy: the engine that a strategy stage becomes, and every hook
// a job calls on it. A built-in strategy's header says how its stage becomes its engine, with a
// make_engine(stage) found by argument-dependent lookup; a user-written strategy (loom::strategy(S))
// is its own engine. Adding a strategy adds its files and touches no list.
//
// The required hooks (loom::Strategy names them for user-written strategies):
//     static constexpr std::string_view name
//     void setup(strategy_context&)            in build(): wrap the module, fill the schedule
//     void before_forward(strategy_context&)   at the start of job.forward()
//     void after_backward(strategy_context&)   after loss.backward(): finish the gradient sync
// The optional ones are listed once, in LOOM_ENGINE_HOOKS (loom/dsl/rule_table.hpp), each with its
// signature; from that list follow the check that an engine's member of a hook's name has it (rule
// R14, with the signature: never a silent default), and hooks::<hook>(engine, ...), the call the
// job makes, which runs hook_defaults<E>::<hook> below when the engine has none. A sharding
// strategy must override the state hooks (LOOM_SHARDING_HOOKS; R14 names the missing one); its own
// state (say, a step counter) goes in strategy_state. The engine's constants, each false unless it
// says otherwise, are LOOM_ENGINE_FLAGS below.

#include <loom/dsl/rule_table.hpp>
#include <loom/dsl/strategy.hpp>
#include <loom/runtime/tensors.hpp>
#include <loom/strategies/strategy_context.hpp>

#include <concepts>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom {

template <class E>
concept Engine = std::move_constructible<E> && requires(E& engine, strategy_context& context) {
  { E::name } -> std::convertible_to<std::string_view>;
  engine.setup(context);
  engine.before_forward(context);
  engine.after_backward(context);
};

// A user-written strategy is its own engine.
template <class S>
S make_engine(const strategy_stage<S>& stage) {
  return stage.get();
}

namespace hooks {

namespace detail {

// Whether `Call` calls an engine's hook, given lvalues of the parameters of `Signature`, with a
// result that converts to its result (any result, for a hook that returns nothing). A concept, so
// that the result is asked for only of a call that can be made.
template <class Call, class E, class Result, class... Parameters>
concept calls_with = std::is_invocable_v<Call, E&, Parameters&...> &&
    (std::is_void_v<Result> || std::convertible_to<std::invoke_result_t<Call, E&, Parameters&...>, Result>);
template <class Call, class E, class Signature>
inline constexpr bool calls_as = false;
template <class Call, class E, class Result, class... Parameters>
inline constexpr bool calls_as<Call, E, Result(Parameters...)> = calls_with<Call, E, Result, Parameters...>;

}  // namespace detail

// overrides_<hook><E>: E has the hook with its signature; names_<hook><E>: E has a member of the
// hook's name, whatever it takes (one that is not overloaded).
#define LOOM_DETAIL_HOOK_CONCEPTS(hook, result, parameters, qualifier, ...)                           \
  struct call_##hook {                                                                                \
    template <class E, class... Arguments>                                                            \
    auto operator()(E& engine, Arguments&... arguments) const -> decltype(engine.hook(arguments...)); \
  };                                                                                                  \
  template <class E>                                                                                  \
  concept overrides_##hook = detail::calls_as<call_##hook, qualifier E, result parameters>;           \
  template <class E>                                                                                  \
  concept names_##hook = requires {                                                                   \
    &E::hook;                                                                                         \
  };
LOOM_ENGINE_HOOKS(LOOM_DETAIL_HOOK_CONCEPTS)
#undef LOOM_DETAIL_HOOK_CONCEPTS

// What the job does for a hook the engine does not have (defined below).
template <class E>
struct hook_defaults;

// hooks::<hook>(engine, arguments...): the engine's hook, or the job's default.
#define LOOM_DETAIL_HOOK_CALL(hook, result, parameters, qualifier, ...)             \
  template <Engine E, class... Arguments>                                           \
  result hook(qualifier E& engine, Arguments&&... arguments) {                      \
    if constexpr (overrides_##hook<E>) {                                            \
      return engine.hook(std::forward<Arguments>(arguments)...);                    \
    } else {                                                                        \
      return hook_defaults<E>::hook(engine, std::forward<Arguments>(arguments)...); \
    }                                                                               \
  }
LOOM_ENGINE_HOOKS(LOOM_DETAIL_HOOK_CALL)
#undef LOOM_DETAIL_HOOK_CALL

// The engine's constants, X(flag):
//   shards_parameters: each rank holds its own part of the parameters (so each saves its own); false:
//       the ranks hold replicas.
//   materialises_parameters: loom::nn's layers are constructed without their bytes
//       (loom/nn/deferred_init.hpp) and setup gives every parameter its values through
//       context.initial_values().fill; false: the model is constructed whole.
//   casts_parameters: the engine carries out mixed_precision(...) by casting the parameters itself
//       (fsdp() gathers them in the policy's param dtype), reading context.precision() in setup;
//       false: the job runs the forward under autocast.
#define LOOM_ENGINE_FLAGS(X) X(shards_parameters) X(materialises_parameters) X(casts_parameters)
#define LOOM_DETAIL_ENGINE_FLAG(flag)      \
  template <Engine E>                      \
  constexpr bool flag() {                  \
    if constexpr (requires { E::flag; }) { \
      return E::flag;                      \
    } else {                               \
      return false;                        \
    }                                      \
  }
LOOM_ENGINE_FLAGS(LOOM_DETAIL_ENGINE_FLAG)
#undef LOOM_DETAIL_ENGINE_FLAG

// What the optimizer steps: the trainable parameters, or their shards under a sharding strategy.
[[nodiscard]] std::vector<at::Tensor> trainable_tensors(const strategy_context& context);

// The gradients' p-norm, computed and applied on their device as torch.nn.utils.clip_grad_norm_
// (foreach) does, without a read on the host.
// What the gradients of `parameters` add to the norm (those without one add nothing): the sum of
// their p-th powers, or for p = infinity their largest magnitude; a 0-d double tensor on `device`.
[[nodiscard]] at::Tensor grad_norm_part(const std::vector<at::Tensor>& parameters, double norm_type,
                                        c10::Device device);
// The norm from a part, or from parts added up (or, for infinity, maxed) across tensors and ranks.
[[nodiscard]] at::Tensor grad_norm_of(const at::Tensor& part, double norm_type);
// Scales the gradients by min(1, max_norm / (norm + 1e-6)), the factor computed on the device.
void scale_grads_to(const std::vector<at::Tensor>& parameters, double max_norm, const at::Tensor& norm);
// The three over `parameters`, where every rank holds the same gradients: the global norm.
at::Tensor clip_local_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type,
                                c10::Device device);
// Under tensor_parallel (context.tensor_split()), an engine's part of the norm is over its ranks'
// slices of the split parameters and copies of the others: the part of named `parameters` counts a
// copy's 1/k (so that the tensor group's k copies count once), and add_up_over_tensor_group sums
// the parts (for infinity, maxes them) over the group once the engine has over its own ranks.
// Without the stage, grad_norm_part's and nothing.
[[nodiscard]] at::Tensor grad_norm_part(const strategy_context& context, const std::vector<named_tensor>& parameters,
                                        double norm_type, c10::Device device);
void add_up_over_tensor_group(const strategy_context& context, at::Tensor& part, double norm_type);

// Throws std::invalid_argument for a non-empty state given to an engine that keeps none.
void require_no_strategy_state(std::string_view engine_name, const tensor_state& state);

template <class E>
struct hook_defaults {
  static void before_backward(E&, strategy_context&, const at::Tensor&) {}
  static std::vector<at::Tensor> optimizer_parameters(const E&, const strategy_context& context) {
    return trainable_tensors(context);
  }
  // The local norm, which the replicas agree on; the global norm before clipping, a 0-d tensor on
  // the device: the host never waits for it.
  static at::Tensor clip_grad_norm(E& engine, strategy_context& context, double max_norm, double norm_type) {
    if (context.tensor_split() == nullptr) {
      return clip_local_grad_norm(hooks::optimizer_parameters(engine, context), max_norm, norm_type,
                                  context.rt().device());
    }
    at::Tensor part = grad_norm_part(context, context.trainable(), norm_type, context.rt().device());
    add_up_over_tensor_group(context, part, norm_type);
    const at::Tensor norm = grad_norm_of(part, norm_type);
    scale_grads_to(hooks::optimizer_parameters(engine, context), max_norm, norm);
    return norm;
  }
  // An engine's may throw a clearer error for what ended a forward (a unit used while sharded).
  static void explain_forward_failure(E&, strategy_context&, std::exception_ptr) {}
  // A sharding engine gathers the whole parameters first, and keeps its rows of the result (merge,
  // unmerge).
  static void with_full_parameters(E&, strategy_context&, const std::function<void()>& change) { change(); }
  // The module's parameters and buffers, whole.
  static tensor_state full_state(E&, strategy_context& context) { return module_state(context.module()); }
  // A replica holds all of it.
  static tensor_state local_state(E& engine, strategy_context& context) { return hooks::full_state(engine, context); }
  static void load_full_state(E&, strategy_context& context, const tensor_state& state) {
    loom::load_module_state(context.module(), state);
  }
  // Takes back what local_state gave on this rank (a checkpoint of the same world size): the whole.
  static void load_local_state(E& engine, strategy_context& context, const tensor_state& state) {
    hooks::load_full_state(engine, context, state);
  }
  // A sharding engine's: this rank's shard of `name` from its shards over another number of ranks.
  static std::optional<at::Tensor> reshard_local(E&, strategy_context&, const std::string&,
                                                 const std::vector<at::Tensor>&) {
    return std::nullopt;
  }
  // How many ranks' shards make up one whole copy of the parameters: fewer than the world under
  // hybrid sharding, whose groups replicate each other (a checkpoint records it to reshard).
  static int shard_group_size(const E&, const strategy_context& context) { return context.rt().world_size(); }
  static tensor_state strategy_state(E&, strategy_context&) { return {}; }
  static void load_strategy_state(E&, strategy_context&, const tensor_state& state) {
    require_no_strategy_state(E::name, state);
  }
};

}  // namespace hooks
}  // namespace loom

#pragma once
// The seam between a job and its strategy: the engine that a strategy stage becomes, and every hook
// a job calls on it. A built-in strategy's header says how its stage becomes its engine, with a
// make_engine(stage) found by argument-dependent lookup; a user-written strategy (loom::strategy(S))
// is its own engine. Adding a strategy adds its files and touches no list.
//
// Hooks, in the order of a job's life:
//   required (loom::Strategy names them for user-written strategies):
//     static constexpr std::string_view name
//     void setup(strategy_context&)            in build(): wrap the module, fill the schedule
//     void before_forward(strategy_context&)   at the start of job.forward()
//     void after_backward(strategy_context&)   after loss.backward(): finish the gradient sync
//   optional, with what the job does when the engine has none:
//     void before_backward(strategy_context&, const at::Tensor& loss)        nothing
//     std::vector<at::Tensor> optimizer_parameters(const strategy_context&)  the trainable parameters
//     double clip_grad_norm(strategy_context&, double max, double p)  the local norm: replicas agree
//     void explain_forward_failure(strategy_context&, std::exception_ptr error)               nothing
//         may throw a clearer error for what ended a forward (a unit used while sharded)
//     void with_full_parameters(strategy_context&, const std::function<void()>& change)
//         runs `change` on the module's whole parameters (merge, unmerge); a sharding engine gathers
//         them first and keeps its rows of the result
//     tensor_state full_state(strategy_context&)     the module's parameters and buffers, whole
//     tensor_state local_state(strategy_context&)    full_state: a replica holds all of it
//     void load_full_state(strategy_context&, const tensor_state&)           copied into the module
//     void load_local_state(strategy_context&, const tensor_state&)  load_full_state: it is the whole
//     static constexpr bool shards_parameters                         false: ranks hold replicas
//     std::optional<at::Tensor> reshard_local(strategy_context&, const std::string& name,
//                                             const std::vector<at::Tensor>& old_shards)    nothing
//         this rank's shard of `name` from its shards over another number of ranks
//     tensor_state strategy_state(strategy_context&)                          none
//     void load_strategy_state(strategy_context&, const tensor_state&)       only an empty state
// A sharding strategy overrides the state hooks: full_state gathers, local_state is this rank's
// shards, and its own state (say, a step counter) goes in strategy_state.

#include <loom/dsl/strategy.hpp>
#include <loom/runtime/tensors.hpp>
#include <loom/strategies/strategy_context.hpp>

#include <concepts>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
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

// Calls an optional hook, or does what the job does without one.
namespace hooks {

template <Engine E>
void before_backward(E& engine, strategy_context& context, const at::Tensor& loss) {
  if constexpr (requires { engine.before_backward(context, loss); }) engine.before_backward(context, loss);
}

// What the optimizer steps: the trainable parameters, or their shards under a sharding strategy.
[[nodiscard]] std::vector<at::Tensor> trainable_tensors(const strategy_context& context);

template <Engine E>
std::vector<at::Tensor> optimizer_parameters(const E& engine, const strategy_context& context) {
  if constexpr (requires { engine.optimizer_parameters(context); }) {
    return engine.optimizer_parameters(context);
  } else {
    return trainable_tensors(context);
  }
}

// torch::nn::utils::clip_grad_norm_ over `parameters`: the global norm where every rank holds the
// same gradients.
double clip_local_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type);

template <Engine E>
double clip_grad_norm(E& engine, strategy_context& context, double max_norm, double norm_type) {
  if constexpr (requires { engine.clip_grad_norm(context, max_norm, norm_type); }) {
    return engine.clip_grad_norm(context, max_norm, norm_type);
  } else {
    return clip_local_grad_norm(optimizer_parameters(engine, context), max_norm, norm_type);
  }
}

template <Engine E>
void explain_forward_failure(E& engine, strategy_context& context, std::exception_ptr error) {
  if constexpr (requires { engine.explain_forward_failure(context, error); })
    engine.explain_forward_failure(context, error);
}

template <Engine E>
void with_full_parameters(E& engine, strategy_context& context, const std::function<void()>& change) {
  if constexpr (requires { engine.with_full_parameters(context, change); }) {
    engine.with_full_parameters(context, change);
  } else {
    change();
  }
}

template <Engine E>
tensor_state full_state(E& engine, strategy_context& context) {
  if constexpr (requires { engine.full_state(context); }) {
    return engine.full_state(context);
  } else {
    return module_state(context.module());
  }
}

template <Engine E>
tensor_state local_state(E& engine, strategy_context& context) {
  if constexpr (requires { engine.local_state(context); }) {
    return engine.local_state(context);
  } else {
    return full_state(engine, context);
  }
}

template <Engine E>
void load_full_state(E& engine, strategy_context& context, const tensor_state& state) {
  if constexpr (requires { engine.load_full_state(context, state); }) {
    engine.load_full_state(context, state);
  } else {
    loom::load_module_state(context.module(), state);
  }
}

// Takes back what local_state gave on this rank (a checkpoint of the same world size).
template <Engine E>
void load_local_state(E& engine, strategy_context& context, const tensor_state& state) {
  if constexpr (requires { engine.load_local_state(context, state); }) {
    engine.load_local_state(context, state);
  } else {
    load_full_state(engine, context, state);
  }
}

// Whether each rank holds its own part of the parameters (so each saves its own), or a replica.
template <Engine E>
constexpr bool shards_parameters() {
  if constexpr (requires { E::shards_parameters; }) {
    return E::shards_parameters;
  } else {
    return false;
  }
}

template <Engine E>
std::optional<at::Tensor> reshard_local(E& engine, strategy_context& context, const std::string& name,
                                        const std::vector<at::Tensor>& old_shards) {
  if constexpr (requires { engine.reshard_local(context, name, old_shards); }) {
    return engine.reshard_local(context, name, old_shards);
  } else {
    return std::nullopt;
  }
}

template <Engine E>
tensor_state strategy_state(E& engine, strategy_context& context) {
  if constexpr (requires { engine.strategy_state(context); }) {
    return engine.strategy_state(context);
  } else {
    return {};
  }
}

// Throws std::invalid_argument for a non-empty state given to an engine that keeps none.
void require_no_strategy_state(std::string_view engine_name, const tensor_state& state);

template <Engine E>
void load_strategy_state(E& engine, strategy_context& context, const tensor_state& state) {
  if constexpr (requires { engine.load_strategy_state(context, state); }) {
    engine.load_strategy_state(context, state);
  } else {
    require_no_strategy_state(E::name, state);
  }
}

}  // namespace hooks
}  // namespace loom

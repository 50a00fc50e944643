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
//     at::Tensor clip_grad_norm(strategy_context&, double max, double p)  the local norm: replicas agree
//         the global norm before clipping, a 0-d tensor on the device: the host never waits for it
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
//     static constexpr bool materialises_parameters    false: the model is constructed whole; true:
//         loom::nn's layers are constructed without their bytes (loom/nn/deferred_init.hpp) and
//         setup gives every parameter its values through context.initial_values().fill
//     static constexpr bool casts_parameters    false: under mixed_precision(...) the job runs the
//         forward under autocast; true: the engine casts the parameters itself (fsdp() gathers them
//         in the policy's param dtype), reading context.precision() in setup
//     std::optional<at::Tensor> reshard_local(strategy_context&, const std::string& name,
//                                             const std::vector<at::Tensor>& old_shards)    nothing
//         this rank's shard of `name` from its shards over another number of ranks
//     int shard_group_size(const strategy_context&) const                     the world size
//         how many ranks' shards make up one whole copy of the parameters: fewer than the world under
//         hybrid sharding, whose groups replicate each other (a checkpoint records it to reshard)
//     tensor_state strategy_state(strategy_context&)                          none
//     void load_strategy_state(strategy_context&, const tensor_state&)       only an empty state
// A hook's member of another signature is a compile error (rule R14, with the signature), never a
// silent default; a sharding strategy must override the state hooks (R14 names the missing one):
// optimizer_parameters, clip_grad_norm, with_full_parameters, full_state (gathers), local_state (this
// rank's shards), load_full_state, load_local_state and reshard_local; its own state (say, a step
// counter) goes in strategy_state.

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

// Each optional hook as the job calls it: overrides_<hook><E> when E has it with its signature.
namespace hooks {

template <class E>
concept overrides_before_backward = requires(E& engine, strategy_context& context, const at::Tensor& loss) {
  engine.before_backward(context, loss);
};
template <class E>
concept overrides_optimizer_parameters = requires(const E& engine, const strategy_context& context) {
  { engine.optimizer_parameters(context) } -> std::convertible_to<std::vector<at::Tensor>>;
};
template <class E>
concept overrides_clip_grad_norm = requires(E& engine, strategy_context& context, double max_norm, double p) {
  { engine.clip_grad_norm(context, max_norm, p) } -> std::convertible_to<at::Tensor>;
};
template <class E>
concept overrides_explain_forward_failure = requires(E& engine, strategy_context& context, std::exception_ptr error) {
  engine.explain_forward_failure(context, error);
};
template <class E>
concept overrides_with_full_parameters = requires(E& engine, strategy_context& context,
                                                  const std::function<void()>& change) {
  engine.with_full_parameters(context, change);
};
template <class E>
concept overrides_full_state = requires(E& engine, strategy_context& context) {
  { engine.full_state(context) } -> std::convertible_to<tensor_state>;
};
template <class E>
concept overrides_local_state = requires(E& engine, strategy_context& context) {
  { engine.local_state(context) } -> std::convertible_to<tensor_state>;
};
template <class E>
concept overrides_load_full_state = requires(E& engine, strategy_context& context, const tensor_state& state) {
  engine.load_full_state(context, state);
};
template <class E>
concept overrides_load_local_state = requires(E& engine, strategy_context& context, const tensor_state& state) {
  engine.load_local_state(context, state);
};
template <class E>
concept overrides_reshard_local = requires(E& engine, strategy_context& context, const std::string& name,
                                           const std::vector<at::Tensor>& shards) {
  { engine.reshard_local(context, name, shards) } -> std::convertible_to<std::optional<at::Tensor>>;
};
template <class E>
concept overrides_shard_group_size = requires(const E& engine, const strategy_context& context) {
  { engine.shard_group_size(context) } -> std::convertible_to<int>;
};
template <class E>
concept overrides_strategy_state = requires(E& engine, strategy_context& context) {
  { engine.strategy_state(context) } -> std::convertible_to<tensor_state>;
};
template <class E>
concept overrides_load_strategy_state = requires(E& engine, strategy_context& context, const tensor_state& state) {
  engine.load_strategy_state(context, state);
};

// names_<hook><E>: E has a member of the hook's name, whatever it takes (one that is not overloaded).
#define LOOM_DETAIL_NAMES_HOOK(hook, ...) \
  template <class E>                      \
  concept names_##hook = requires {       \
    &E::hook;                             \
  };
LOOM_ENGINE_HOOKS(LOOM_DETAIL_NAMES_HOOK)
#undef LOOM_DETAIL_NAMES_HOOK

// Whether each rank holds its own part of the parameters (so each saves its own), or a replica.
template <Engine E>
constexpr bool shards_parameters() {
  if constexpr (requires { E::shards_parameters; }) {
    return E::shards_parameters;
  } else {
    return false;
  }
}

// Whether the engine's setup gives the parameters their values (context.initial_values()), so that
// the model may be constructed without them.
template <Engine E>
constexpr bool materialises_parameters() {
  if constexpr (requires { E::materialises_parameters; }) {
    return E::materialises_parameters;
  } else {
    return false;
  }
}

// Whether the engine carries out mixed_precision(...) by casting the parameters itself, rather than
// the job by running the forward under autocast.
template <Engine E>
constexpr bool casts_parameters() {
  if constexpr (requires { E::casts_parameters; }) {
    return E::casts_parameters;
  } else {
    return false;
  }
}

// Calls an optional hook, or does what the job does without one.

template <Engine E>
void before_backward(E& engine, strategy_context& context, const at::Tensor& loss) {
  if constexpr (overrides_before_backward<E>) engine.before_backward(context, loss);
}

// What the optimizer steps: the trainable parameters, or their shards under a sharding strategy.
[[nodiscard]] std::vector<at::Tensor> trainable_tensors(const strategy_context& context);

template <Engine E>
std::vector<at::Tensor> optimizer_parameters(const E& engine, const strategy_context& context) {
  if constexpr (overrides_optimizer_parameters<E>) {
    return engine.optimizer_parameters(context);
  } else {
    return trainable_tensors(context);
  }
}

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

template <Engine E>
at::Tensor clip_grad_norm(E& engine, strategy_context& context, double max_norm, double norm_type) {
  if constexpr (overrides_clip_grad_norm<E>) {
    return engine.clip_grad_norm(context, max_norm, norm_type);
  } else {
    return clip_local_grad_norm(optimizer_parameters(engine, context), max_norm, norm_type, context.rt().device());
  }
}

template <Engine E>
void explain_forward_failure(E& engine, strategy_context& context, std::exception_ptr error) {
  if constexpr (overrides_explain_forward_failure<E>) engine.explain_forward_failure(context, error);
}

template <Engine E>
void with_full_parameters(E& engine, strategy_context& context, const std::function<void()>& change) {
  if constexpr (overrides_with_full_parameters<E>) {
    engine.with_full_parameters(context, change);
  } else {
    change();
  }
}

template <Engine E>
tensor_state full_state(E& engine, strategy_context& context) {
  if constexpr (overrides_full_state<E>) {
    return engine.full_state(context);
  } else {
    return module_state(context.module());
  }
}

template <Engine E>
tensor_state local_state(E& engine, strategy_context& context) {
  if constexpr (overrides_local_state<E>) {
    return engine.local_state(context);
  } else {
    return full_state(engine, context);
  }
}

template <Engine E>
void load_full_state(E& engine, strategy_context& context, const tensor_state& state) {
  if constexpr (overrides_load_full_state<E>) {
    engine.load_full_state(context, state);
  } else {
    loom::load_module_state(context.module(), state);
  }
}

// Takes back what local_state gave on this rank (a checkpoint of the same world size).
template <Engine E>
void load_local_state(E& engine, strategy_context& context, const tensor_state& state) {
  if constexpr (overrides_load_local_state<E>) {
    engine.load_local_state(context, state);
  } else {
    load_full_state(engine, context, state);
  }
}

template <Engine E>
std::optional<at::Tensor> reshard_local(E& engine, strategy_context& context, const std::string& name,
                                        const std::vector<at::Tensor>& old_shards) {
  if constexpr (overrides_reshard_local<E>) {
    return engine.reshard_local(context, name, old_shards);
  } else {
    return std::nullopt;
  }
}

template <Engine E>
int shard_group_size(const E& engine, const strategy_context& context) {
  if constexpr (overrides_shard_group_size<E>) {
    return engine.shard_group_size(context);
  } else {
    return context.rt().world_size();
  }
}

template <Engine E>
tensor_state strategy_state(E& engine, strategy_context& context) {
  if constexpr (overrides_strategy_state<E>) {
    return engine.strategy_state(context);
  } else {
    return {};
  }
}

// Throws std::invalid_argument for a non-empty state given to an engine that keeps none.
void require_no_strategy_state(std::string_view engine_name, const tensor_state& state);

template <Engine E>
void load_strategy_state(E& engine, strategy_context& context, const tensor_state& state) {
  if constexpr (overrides_load_strategy_state<E>) {
    engine.load_strategy_state(context, state);
  } else {
    require_no_strategy_state(E::name, state);
  }
}

}  // namespace hooks
}  // namespace loom

#pragma once
// loom::build(plan, runtime): a validated plan becomes a job on this process's share of the world.

#include <loom/dsl.hpp>
#include <loom/job/job.hpp>
#include <loom/nn/deferred_init.hpp>
#include <loom/nn/recompute.hpp>
#include <loom/precision/precision.hpp>
#include <loom/replicas/replicas.hpp>
#include <loom/strategies/ddp.hpp>
#include <loom/strategies/engine.hpp>
#include <loom/strategies/fsdp.hpp>
#include <loom/strategies/local.hpp>

#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>

namespace loom {

namespace detail {

template <class M, class Tuple>
inline constexpr bool constructible_from_tuple = false;

template <class M, class... Args>
inline constexpr bool constructible_from_tuple<M, std::tuple<Args...>> = std::is_constructible_v<M, const Args&...>;

// A strategy stage's engine comes from the make_engine(stage) that the strategy's own header
// declares (loom/strategies/<name>.hpp), found by argument-dependent lookup.
template <class Stage>
inline constexpr bool has_engine = requires(const Stage& stage) {
  { make_engine(stage) } -> Engine;
};

// The model and its adapters, as the plan's stages before the strategy made them.
template <class M>
struct constructed {
  module_storage<M> model;
  std::optional<lora_layers> lora;
};

// What build() reads of any plan, typed or from a run file: the model's arguments, the stages between
// the model and the strategy, the strategy, and the plan's text.
template <class Args, class Strategy>
struct plan_value {
  const Args& model_args;
  const stage_list& stages;
  const Strategy& strategy;
  std::string text;   // describe()
  std::string state;  // describe_state()
};

template <class M, class Args, class Strategy>
auto build_checked(const plan_value<Args, Strategy>& plan, runtime rt) {
  auto engine = make_engine(plan.strategy);
  using E = decltype(engine);
  LOOM_CHECK_ENGINE_HOOKS(E)
  std::optional<std::uint64_t> seed;
  if (const auto seeded = plan.stages.template find<seeded_stage>()) seed = seeded->seed();

  build_decisions decided;
  decided.plan_state = plan.state;
  if (auto stage = plan.stages.template find<default_dtype_stage>()) decided.built_in = stage->type();
  if (auto stage = plan.stages.template find<mixed_precision_stage>())
    decided.policy = precision_policy::from(stage->settings());
  // Opened, every header read and checked, before the model is constructed: a missing or truncated
  // file stops the build at once.
  if (auto stage = plan.stages.template find<pretrained_stage>())
    decided.pretrained = std::make_shared<pretrained_checkpoint>(stage->path());

  // Construction (in the plan's default_dtype), then the adapters' initial weights (in fp32), from
  // one forked stream when seeded; for an engine that materialises its parameters, without their
  // bytes while the construction allows it (loom/nn/deferred_init.hpp), else whole.
  constexpr std::string_view model_name = type_name<M>();
  using module_type = std::remove_pointer_t<decltype(std::declval<module_storage<M>&>().operator->())>;
  if constexpr (requires { module_type::peft_task_type; }) decided.peft_task_type = module_type::peft_task_type;
  const auto construct = [&](nn::deferred_init* deferred) {
    std::optional<forked_rng> fork;
    if (seed) fork.emplace(*seed);
    std::optional<nn::deferred_init::scope> without_bytes;
    if (deferred != nullptr) without_bytes.emplace(*deferred);
    constructed<M> made{[&] {
                          const default_dtype_scope built_in(decided.built_in);
                          return std::apply([](const auto&... args) { return module_storage<M>::make(args...); },
                                            plan.model_args);
                        }(),
                        std::nullopt};
    if (auto spec = plan.stages.template find<lora_stage>()) {
      made.lora = lora_layers::inject(*made.model.base(), model_name, *spec,
                                      decided.policy ? std::optional(decided.policy->param) : std::nullopt);
    }
    return made;
  };
  std::shared_ptr<nn::deferred_init> deferred;
  if constexpr (hooks::materialises_parameters<E>()) deferred = std::make_shared<nn::deferred_init>();
  constructed<M> made = construct(deferred.get());
  if (deferred) {
    if (std::optional<std::string> reason = deferred->accept(*made.model.base())) {
      decided.constructed_whole = std::move(*reason);
      if (!seed) deferred->rewind_generator();
      deferred.reset();
      made = construct(nullptr);
    } else if (deferred->size() == 0) {
      deferred.reset();
    }
  }
  auto base = made.model.base();
  if (decided.pretrained) {
    // A sharding engine reads it in its setup, each rank what it keeps; the others now, whole.
    decided.pretrained->check(*base, &lora_adapter::is_adapter_parameter);
    if constexpr (!hooks::shards_parameters<E>()) {
      decided.pretrained->copy_into(*base, &lora_adapter::is_adapter_parameter);
      decided.pretrained_read = true;
    }
  }

  const auto trainable = plan.stages.template find<trainable_stage>();
  set_trainable(*base, model_name, made.lora.has_value(), trainable ? trainable->patterns() : target_list{});
  if (decided.built_in) decided.trainable_held_in_fp32 = hold_trainable_in_fp32(*base);
  if (auto stage = plan.stages.template find<recompute_stage>())
    decided.recomputed_units = nn::recompute_units(*base, stage->settings());
  if (deferred) {
    nn::to_device(*base, rt.device());
  } else {
    base->to(rt.device());
  }
  if (seed) {
    verify_identical_replicas(rt, *base, *seed);
  } else {
    broadcast_replicas(rt, *base, deferred.get());
  }
  if (deferred) deferred->set_advances_generator(!seed);
  decided.deferred = std::move(deferred);
  return job<M, E>(std::move(made.model), std::move(rt), std::move(made.lora), plan.text, std::move(engine), decided);
}

template <class M, class Stage>
using job_for = job<M, decltype(make_engine(std::declval<const Stage&>()))>;

template <class M, class Strategies>
struct jobs_for;
template <class M, class... Stages>
struct jobs_for<M, std::variant<Stages...>> {
  using type = std::variant<job_for<M, Stages>...>;
};

}  // namespace detail

// The job types a run_plan over M can become, one per strategy a run file can name (run_strategy):
// visit it to train, with job.module() typed as always.
template <class M>
using run_job = typename detail::jobs_for<M, run_strategy>::type;

// A plan chosen at run time (loom/config/run_file.hpp) becomes the job of its strategy.
template <class Model>
[[nodiscard]] run_job<typename Model::model_type> build(const run_plan<Model>& plan, runtime rt) {
  using M = typename Model::model_type;
  static_assert(TorchModule<M>, LOOM_R7_NOT_A_MODULE);
  static_assert(detail::constructible_from_tuple<M, std::remove_cvref_t<decltype(plan.model_args())>>,
                LOOM_R7_NOT_CONSTRUCTIBLE);
  static_assert(detail::has_forward<M>, LOOM_R7_NO_FORWARD);
  return std::visit(
      [&](const auto& stage) -> run_job<M> {
        return detail::build_checked<M>(
            detail::plan_value{plan.model_args(), plan.stage_values(), stage, plan.describe(), plan.describe_state()},
            std::move(rt));
      },
      plan.strategy());
}

// R7 is checked here, where the plan meets LibTorch; a failed check stops before the body, so the
// sentence is the whole diagnostic.
template <class Plan>
requires is_plan<Plan>
[[nodiscard]] auto build(const Plan& plan, runtime rt) {
  using M = typename Plan::model_type;
  constexpr bool is_module = TorchModule<M>;
  constexpr bool constructible = detail::constructible_from_tuple<M, std::remove_cvref_t<decltype(plan.model_args())>>;
  constexpr bool has_engine = detail::has_engine<typename Plan::strategy_type>;
  static_assert(is_module, LOOM_R7_NOT_A_MODULE);
  static_assert(!is_module || constructible, LOOM_R7_NOT_CONSTRUCTIBLE);
  static_assert(!is_module || !constructible || detail::has_forward<M>, LOOM_R7_NO_FORWARD);
  static_assert(has_engine,
                "loom: this strategy stage has no engine: include its header, loom/strategies/<name>.hpp (or "
                "loom/loom.hpp)");
  if constexpr (is_module && constructible && detail::has_forward<M> && has_engine) {
    const stage_list stages = plan.stage_values();
    const auto strategy = plan.strategy();
    return detail::build_checked<M>(
        detail::plan_value{plan.model_args(), stages, strategy, plan.describe(), plan.describe_state()}, std::move(rt));
  }
}

// READ THIS: build() takes a whole plan. A partial pipeline such as `lora(8) | ddp()` has no model
// yet: pipe it into one, `build(model<M>(args...) | adapters, rt)`.
template <class NotAPlan>
requires(!is_plan<NotAPlan>) void build(const NotAPlan&, const runtime&) { require_plan<NotAPlan>(); }

}  // namespace loom

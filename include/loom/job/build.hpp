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

template <class Plan>
auto build_checked(const Plan& plan, runtime rt) {
  using M = typename Plan::model_type;
  auto engine = make_engine(plan.strategy());
  using E = decltype(engine);
  LOOM_CHECK_ENGINE_HOOKS(E)

  build_decisions decided;
  decided.plan_state = plan.describe_state();
  decided.built_in = plan.default_dtype();
  if (auto policy = plan.mixed_precision()) decided.policy = precision_policy::from(*policy);
  // Opened, every header read and checked, before the model is constructed: a missing or truncated
  // file stops the build at once.
  if (auto path = plan.pretrained()) decided.pretrained = std::make_shared<pretrained_checkpoint>(*path);

  // Construction (in the plan's default_dtype), then the adapters' initial weights (in fp32), from
  // one forked stream when seeded; for an engine that materialises its parameters, without their
  // bytes while the construction allows it (loom/nn/deferred_init.hpp), else whole.
  constexpr std::string_view model_name = type_name<M>();
  using module_type = std::remove_pointer_t<decltype(std::declval<module_storage<M>&>().operator->())>;
  if constexpr (requires { module_type::peft_task_type; }) decided.peft_task_type = module_type::peft_task_type;
  const auto construct = [&](nn::deferred_init* deferred) {
    std::optional<forked_rng> fork;
    if (auto seed = plan.seed()) fork.emplace(*seed);
    std::optional<nn::deferred_init::scope> without_bytes;
    if (deferred != nullptr) without_bytes.emplace(*deferred);
    constructed<M> made{[&] {
                          const default_dtype_scope built_in(decided.built_in);
                          return std::apply([](const auto&... args) { return module_storage<M>::make(args...); },
                                            plan.model_args());
                        }(),
                        std::nullopt};
    if (auto spec = plan.lora()) {
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
      if (!plan.seed()) deferred->rewind_generator();
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

  set_trainable(*base, model_name, made.lora.has_value(), plan.trainable_patterns());
  if (decided.built_in) decided.trainable_held_in_fp32 = hold_trainable_in_fp32(*base);
  if (auto spec = plan.recompute()) decided.recomputed_units = nn::recompute_units(*base, *spec);
  if (deferred) {
    nn::to_device(*base, rt.device());
  } else {
    base->to(rt.device());
  }
  if (auto seed = plan.seed()) {
    verify_identical_replicas(rt, *base, *seed);
  } else {
    broadcast_replicas(rt, *base, deferred.get());
  }
  if (deferred) deferred->set_advances_generator(!plan.seed());
  decided.deferred = std::move(deferred);
  return job<M, E>(std::move(made.model), std::move(rt), std::move(made.lora), plan.describe(), std::move(engine),
                   decided);
}

// A run_plan seen with one of its strategies fixed: what build_checked reads of a plan.
template <class Model, class Strategy>
struct with_strategy {
  const run_plan<Model>& plan;
  Strategy stage;

  using model_type = typename Model::model_type;
  [[nodiscard]] const auto& model_args() const noexcept { return plan.model_args(); }
  [[nodiscard]] auto seed() const { return plan.seed(); }
  [[nodiscard]] auto default_dtype() const { return plan.default_dtype(); }
  [[nodiscard]] auto mixed_precision() const { return plan.mixed_precision(); }
  [[nodiscard]] auto recompute() const { return plan.recompute(); }
  [[nodiscard]] auto pretrained() const { return plan.pretrained(); }
  [[nodiscard]] auto lora() const { return plan.lora(); }
  [[nodiscard]] auto trainable_patterns() const { return plan.trainable_patterns(); }
  [[nodiscard]] std::string describe() const { return plan.describe(); }
  [[nodiscard]] std::string describe_state() const { return plan.describe_state(); }
  [[nodiscard]] const Strategy& strategy() const noexcept { return stage; }
};

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
        return detail::build_checked(detail::with_strategy<Model, std::remove_cvref_t<decltype(stage)>>{plan, stage},
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
  if constexpr (is_module && constructible && detail::has_forward<M> && has_engine)
    return detail::build_checked(plan, std::move(rt));
}

// READ THIS: build() takes a whole plan. A partial pipeline such as `lora(8) | ddp()` has no model
// yet: pipe it into one, `build(model<M>(args...) | adapters, rt)`.
template <class NotAPlan>
requires(!is_plan<NotAPlan>) void build(const NotAPlan&, const runtime&) { require_plan<NotAPlan>(); }

}  // namespace loom

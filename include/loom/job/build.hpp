#pragma once
// loom::build(plan, runtime): a validated plan becomes a job on this process's share of the world.

#include <loom/dsl.hpp>
#include <loom/job/build_steps.hpp>
#include <loom/job/job.hpp>
#include <loom/nn/deferred_init.hpp>
#include <loom/precision/precision.hpp>
#include <loom/replicas/replicas.hpp>
#include <loom/strategies/ddp.hpp>
#include <loom/strategies/engine.hpp>
#include <loom/strategies/fsdp.hpp>
#include <loom/strategies/local.hpp>

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
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

// The module a job holds of M: M itself, or a ModuleHolder's contained module (WanImpl for Wan).
template <class M>
using stored_module = std::remove_pointer_t<decltype(std::declval<module_storage<M>&>().operator->())>;

// What the model says of its names for lora(...)'s targets, from its static members (each
// optional): other names its users give its modules (lora_target_aliases, loom::target_alias), and
// its output head (output_embeddings, transformers' get_output_embeddings()), which loom::all_linear
// leaves out.
template <class Module>
constexpr lora_model_names lora_model_names_of() noexcept {
  lora_model_names names;
  if constexpr (requires { Module::lora_target_aliases; }) names.aliases = Module::lora_target_aliases;
  if constexpr (requires { Module::output_embeddings; }) names.output_embeddings = Module::output_embeddings;
  return names;
}

// What the module says of itself for the files other libraries read, from its static members (each optional).
template <class Module>
model_identity identity_of() {
  model_identity identity;
  if constexpr (requires { Module::peft_task_type; }) identity.peft_task_type = Module::peft_task_type;
  if constexpr (requires {
                  Module::peft_base_model_class;
                  Module::peft_parent_library;
                }) {
    identity.peft_base_model_class = Module::peft_base_model_class;
    identity.peft_parent_library = Module::peft_parent_library;
  }
  if constexpr (requires { Module::diffusers_component; }) identity.diffusers_component = Module::diffusers_component;
  if constexpr (requires { Module::pretrained_components; }) {
    identity.components.assign(Module::pretrained_components.begin(), Module::pretrained_components.end());
  }
  return identity;
}

// pretrained(...)'s checkpoint, read by the model's pretrained_components where it names them.
template <class Module>
std::shared_ptr<pretrained_checkpoint> open_checkpoint(const stage_list& stages) {
  if constexpr (requires { Module::pretrained_components; }) {
    return build_steps::open_checkpoint(stages, Module::pretrained_components);
  } else {
    return build_steps::open_checkpoint(stages);
  }
}

// The modules quantized(...) leaves in full precision: the model's output embeddings (as transformers'
// quantizers keep lm_head) and what its static unquantized_modules names (a dotted part of a name).
template <class Module>
std::vector<std::string_view> unquantized_modules_of() {
  std::vector<std::string_view> names;
  if constexpr (requires { Module::output_embeddings; }) names.push_back(Module::output_embeddings);
  if constexpr (requires { Module::unquantized_modules; }) {
    names.insert(names.end(), Module::unquantized_modules.begin(), Module::unquantized_modules.end());
  }
  return names;
}

// The layers the model splits under tensor_parallel, from its tensor_parallel_plan(), which may
// depend on its configuration (a tied head has no lm_head of its own); none when it has none.
template <class Module>
std::vector<nn::parallel_layer> tensor_parallel_plan_of(const Module& module) {
  if constexpr (requires { module.tensor_parallel_plan(); }) {
    return module.tensor_parallel_plan();
  } else {
    return {};
  }
}

// The parameters the model does not hold because they read others (a tied head's), from its
// tied_parameters(), which depends on its configuration.
template <class Module>
std::vector<tied_parameter> tied_parameters_of(const Module& module) {
  if constexpr (requires { module.tied_parameters(); }) {
    return module.tied_parameters();
  } else {
    return {};
  }
}

// The model and its adapters, as the plan's stages before the strategy made them.
template <class M>
struct constructed {
  module_storage<M> model;
  std::optional<lora_layers> lora;
};

// The model, then the adapters' initial weights, from one stream: forked from seeded(...)'s seed, else
// the default generator. LoRA's draws follow the model's on that stream, so a rank's adapters are the
// same whether the model was built without bytes or whole, under any engine. The model is built in
// default_dtype(...), the adapters in the policy's param dtype or fp32; with `deferred`, without the
// bytes of what the construction allows.
template <class M, class Args>
constructed<M> construct(const Args& model_args, std::optional<std::uint64_t> seed, const build_steps::dtypes& dtypes,
                         const std::optional<lora_stage>& lora, nn::deferred_init* deferred) {
  std::optional<forked_rng> fork;
  if (seed) fork.emplace(*seed);
  std::optional<nn::deferred_init::scope> without_bytes;
  if (deferred != nullptr) without_bytes.emplace(*deferred);
  constructed<M> made{[&] {
                        const default_dtype_scope built_in(dtypes.built_in);
                        return std::apply([](const auto&... args) { return module_storage<M>::make(args...); },
                                          model_args);
                      }(),
                      std::nullopt};
  if (lora) {
    made.lora = lora_layers::inject(*made.model.base(), type_name<M>(), *lora,
                                    dtypes.policy ? std::optional(dtypes.policy->param) : std::nullopt,
                                    lora_model_names_of<stored_module<M>>());
  }
  return made;
}

// The plan's stages applied in order, as named steps (loom/job/build_steps.hpp), then the job.
template <class M, class Args, class Strategy>
auto build_checked(const plan_value<Args, Strategy>& plan, runtime rt) {
  auto engine = make_engine(plan.strategy);
  using E = decltype(engine);
  LOOM_CHECK_ENGINE_HOOKS(E)
  using module_type = stored_module<M>;
  const std::optional<std::uint64_t> seed = build_steps::seed(plan.stages);
  const std::optional<lora_stage> lora = plan.stages.template find<lora_stage>();

  build_decisions decided;
  decided.plan_state = plan.state;
  decided.identity = identity_of<module_type>();
  const build_steps::dtypes dtypes = build_steps::decide_dtypes(plan.stages);
  decided.built_in = dtypes.built_in;
  decided.policy = dtypes.policy;
  decided.pretrained = open_checkpoint<module_type>(plan.stages);

  // An engine that materialises its parameters gets them without bytes where the construction allows.
  // Split layers are cut from the whole, built on every rank as the unsplit run builds them.
  const bool splits_layers = build_steps::splits_layers(plan.stages);
  std::shared_ptr<nn::deferred_init> deferred;
  if constexpr (hooks::materialises_parameters<E>()) {
    if (!splits_layers) deferred = std::make_shared<nn::deferred_init>();
  }
  constructed<M> made = construct<M>(plan.model_args, seed, dtypes, lora, deferred.get());
  if (deferred) {
    switch (build_steps::judge_deferred(*deferred, *made.model.base(), seed.has_value(), decided.constructed_whole)) {
      case build_steps::deferral::stands: break;
      case build_steps::deferral::nothing_deferred: deferred.reset(); break;
      case build_steps::deferral::construct_whole:
        deferred.reset();
        made = construct<M>(plan.model_args, seed, dtypes, lora, nullptr);
        break;
    }
  }
  torch::nn::Module& model = *made.model.base();
  decided.identity.tied = tied_parameters_of(*made.model.operator->());
  if (decided.pretrained)
    decided.pretrained_read =
        build_steps::load_pretrained(*decided.pretrained, model, hooks::shards_parameters<E>() || splits_layers);
  decided.trainable_held_in_fp32 = build_steps::set_what_trains(
      model, type_name<M>(), made.lora ? &*made.lora : nullptr, decided.identity.tied, plan.stages, dtypes.built_in);
  decided.quantized =
      build_steps::quantize_base(model, type_name<M>(), unquantized_modules_of<module_type>(), plan.stages,
                                 decided.pretrained_read ? nullptr : decided.pretrained, deferred.get());
  decided.recomputed_units = build_steps::choose_recomputed_units(model, plan.stages);
  decided.sequence_split =
      build_steps::split_sequences(model, type_name<M>(), plan.stages, rt, dtypes, decided.recomputed_units);
  build_steps::move_to_device(model, rt, deferred.get());
  build_steps::check_or_broadcast_replicas(rt, model, seed, deferred.get());
  decided.tensor_split = build_steps::split_layers(model, type_name<M>(),
                                                   tensor_parallel_plan_of(*made.model.operator->()), plan.stages, rt);
  if (decided.pretrained && decided.tensor_split) build_steps::read_slices(*decided.pretrained, *decided.tensor_split);
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
  // What only a finished plan can lack (operator| checks those with a strategy as they are composed).
  LOOM_STATIC_CHECK(first_violation_when_built(Plan::kinds));
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

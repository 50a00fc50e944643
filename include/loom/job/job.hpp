#pragma once
// job<M, Engine>: a built plan. The user's module, typed, with its strategy's engine around forward
// and backward (docs/strategies.md), its state, and its LoRA adapters.

#include <loom/io/peft.hpp>
#include <loom/io/weights.hpp>
#include <loom/job/gradient_norm.hpp>
#include <loom/lora/lora.hpp>
#include <loom/precision/precision.hpp>
#include <loom/quant/quantized_weight.hpp>
#include <loom/runtime/failpoints.hpp>
#include <loom/schedule/schedule.hpp>
#include <loom/strategies/engine.hpp>
#include <loom/strategies/strategy_context.hpp>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <concepts>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom::nn {
class sequence_split;
class tensor_split;
}  // namespace loom::nn

namespace loom {

namespace detail {

template <class M>
concept module_holder = requires {
  typename M::ContainedType;
}
&&std::derived_from<M, torch::nn::ModuleHolder<typename M::ContainedType>>&&
    std::derived_from<typename M::ContainedType, torch::nn::Module>;

// Whether a class has a member named forward in any form (overloaded, a template, inherited): a class
// derived from it and from one more forward finds the name ambiguous exactly when it has one. A final
// class cannot be derived from: it is taken at its word, and job.forward's call checks it.
struct one_more_forward {
  void forward();
};
template <class T>
struct with_one_more_forward : T, one_more_forward {};
template <class T>
concept names_forward = std::is_class_v<T> &&(std::is_final_v<T> || !requires { &with_one_more_forward<T>::forward; });

// The class whose forward job.forward calls: a holder's module, else M itself.
template <class M>
struct forward_owner {
  using type = M;
};
template <module_holder M>
struct forward_owner<M> {
  using type = typename M::ContainedType;
};
template <class M>
concept has_forward = names_forward<typename forward_owner<M>::type>;

// How a job holds M: a ModuleHolder (TORCH_MODULE) by value, a Module subclass by shared_ptr.
template <class M>
struct module_storage {
  std::shared_ptr<M> held;
  template <class... Args>
  static module_storage make(const Args&... args) {
    return {std::make_shared<M>(args...)};
  }
  M& get() noexcept { return *held; }
  M* operator->() noexcept { return held.get(); }
  std::shared_ptr<torch::nn::Module> base() const { return held; }
};

template <module_holder M>
struct module_storage<M> {
  M held;
  template <class... Args>
  static module_storage make(const Args&... args) {
    return {M(args...)};
  }
  M& get() noexcept { return held; }
  auto* operator->() noexcept { return held.get(); }
  std::shared_ptr<torch::nn::Module> base() const { return held.ptr(); }
};

// A reference to a callable, for the compiled core to call back into a job's template without a
// copy or an allocation; it must not outlive the callable.
template <class Signature>
class function_ref;
template <class R, class... A>
class function_ref<R(A...)> {
 public:
  function_ref() = default;
  template <class F>
  requires(!std::same_as<std::remove_cvref_t<F>, function_ref> && std::is_invocable_r_v<R, F&, A...>)
      function_ref(F&& callable)
  noexcept  // NOLINT(google-explicit-constructor): passed as a lambda
      : object_(static_cast<void*>(std::addressof(callable))), call_([](void* object, A... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(object))(std::forward<A>(args)...);
        }) {}

  R operator()(A... args) const { return call_(object_, std::forward<A>(args)...); }
  explicit operator bool() const noexcept { return call_ != nullptr; }

 private:
  void* object_ = nullptr;
  R (*call_)(void*, A...) = nullptr;
};

// What a call returned, kept across a type-erased call: a value, a reference, or nothing.
template <class T>
class returned {
 public:
  template <class F>
  void capture(F&& call) {
    value_.emplace(std::forward<F>(call)());
  }
  T take() { return std::move(*value_); }

 private:
  std::optional<T> value_;
};
template <class T>
class returned<T&> {
 public:
  template <class F>
  void capture(F&& call) {
    value_ = &std::forward<F>(call)();
  }
  T& take() { return *value_; }

 private:
  T* value_ = nullptr;
};
template <>
class returned<void> {
 public:
  template <class F>
  void capture(F&& call) {
    std::forward<F>(call)();
  }
  void take() {}
};

// What M says of itself, in static members (each optional), for the files other libraries read.
struct model_identity {
  std::string peft_task_type;  // PEFT's task ("CAUSAL_LM"), for AutoPeftModelForCausalLM
  // For a model without a task: the Python class AutoPeftModel loads the base model with
  // ("WanTransformer3DModel") and its module (peft_parent_library), PEFT's auto_mapping.
  std::string peft_base_model_class;
  std::string peft_parent_library;
  std::string diffusers_component;  // its name in a diffusers pipeline ("transformer"), its LoRA keys' prefix
  // A model made of a pipeline's components (pretrained_components: "transformer", "transformer_2"):
  // one adapter a component, in its folder. Empty for a model of one.
  std::vector<std::string> components;
  std::vector<tied_parameter> tied;  // what it reads rather than holds: a tied head's lm_head.weight
};

// What build() decided from the plan's stages before the strategy: the dtypes the model is built
// in and computes in (loom/precision), and the units that recompute (loom/nn/recompute.hpp).
struct build_decisions {
  std::optional<dtype> built_in;                       // default_dtype(...), if any
  std::size_t trainable_held_in_fp32 = 0;              // parameters built narrower that train, held in fp32
  std::optional<precision_policy> policy;              // mixed_precision(...), if any
  std::vector<std::string> recomputed_units;           // recompute(...)'s choice, by name; empty without it
  std::optional<quant::quantized_base> quantized;      // what quantized(...) made, if the plan has it
  std::shared_ptr<pretrained_checkpoint> pretrained;   // pretrained(...)'s checkpoint, if any, checked
  bool pretrained_read = false;                        // copied in already (else after the setup)
  std::shared_ptr<nn::deferred_init> deferred;         // the records of a construction without bytes
  std::string constructed_whole;                       // why an engine that could not have it so
  std::shared_ptr<nn::sequence_split> sequence_split;  // sequence_parallel(k)'s, k > 1; none otherwise
  std::shared_ptr<nn::tensor_split> tensor_split;      // tensor_parallel(k)'s, k > 1; none otherwise
  std::string plan_state;  // the plan's describe_state(): what a checkpoint of the job must have been saved by
  model_identity identity;
};

// What job.forward does for mixed_precision(...), decided once when the job is set up: run under
// autocast (where the engine does not cast the parameters itself), cast the floating inputs (where it
// does, and the policy asks), cast the result (the policy's output). Without mixed_precision(...), none.
struct forward_casting {
  std::optional<at::ScalarType> autocast;
  std::optional<at::ScalarType> inputs;
  std::optional<at::ScalarType> output;

  [[nodiscard]] bool none() const noexcept { return !autocast && !inputs && !output; }
};

// The part of a job that does not depend on M or the strategy (src/job/job.cpp).
class job_core {
 public:
  job_core(runtime rt, std::shared_ptr<torch::nn::Module> module, std::string model_name,
           std::optional<lora_layers> lora, std::string plan_text, const build_decisions& decided);

  [[nodiscard]] strategy_context& context() noexcept { return *context_; }
  [[nodiscard]] const strategy_context& context() const noexcept { return *context_; }
  [[nodiscard]] lora_layers* lora() noexcept { return lora_ ? &*lora_ : nullptr; }

  // After the setup, once the parameters have their values: notes what this rank materialised and
  // read of pretrained(...)'s checkpoint, and closes its files.
  void finish_initial_values();

  // Runs the strategy's setup, then checks the schedule it derived against every other rank's.
  // `engine_casts`: the engine carries out mixed precision itself (else the job, under autocast).
  void set_up(function_ref<void(strategy_context&)> setup, bool engine_casts);
  // The schedule as setup derived it, before an engine rebuilt it from what the first step did
  // (ddp()'s buckets, in the order gradients became ready): what a checkpoint is compatible with,
  // since the rebuild follows from it and the model alone.
  [[nodiscard]] const collective_schedule& built_schedule() const noexcept { return built_schedule_; }
  [[nodiscard]] std::uint64_t built_schedule_fingerprint() const { return built_schedule_.fingerprint(); }

  // What job.forward casts, as set_up decided it.
  [[nodiscard]] const forward_casting& casting() const noexcept { return casting_; }
  // Runs `body` as this rank's `part` of a pass (its progress, for the hang check). An exception
  // that ends it is shown to `explain` first (which may throw a clearer one), then becomes the job's
  // error: a peer's published failure, the ranks that are gone, or this rank's own, published.
  void run_part(pass_part part, function_ref<void()> body, function_ref<void(std::exception_ptr)> explain = {});
  // Runs `body`, whose collectives are outside a pass (clipping's norm, gathering the state); an
  // exception that ends it becomes the job's error as in run_part, naming `during`.
  void run_outside_pass(std::string_view during, function_ref<void()> body);

  [[nodiscard]] lora_layers& require_lora(std::string_view what);

  // Under tensor_parallel: whether the plan split tensors; `state` with this rank's split ones
  // gathered whole over its tensor group (a collective), and whole tensors cut to this rank's parts.
  // Without the stage, nothing and `state` as it is.
  [[nodiscard]] bool splits_tensors() const noexcept { return tensor_split_ != nullptr; }
  [[nodiscard]] int tensor_parallel_size() const noexcept;
  void gather_split(tensor_state& state) const;
  [[nodiscard]] tensor_state split_parts(tensor_state state) const;
  // Each parameter and buffer of the model, by name, as it is whole; and this rank's slice of one.
  [[nodiscard]] std::map<std::string, tensor_layout> whole_layouts() const;
  [[nodiscard]] at::Tensor split_part(const std::string& name, const at::Tensor& whole) const;

  // This rank's place among the ranks that read their own batches: under sequence_parallel(k) its
  // group's (rank / k of world / k), else the rank's.
  [[nodiscard]] int data_rank() const noexcept;
  [[nodiscard]] int data_world_size() const noexcept;

  // The adapters in `format`; rank 0 writes, every rank returns once it has.
  void save_adapter(const std::filesystem::path& folder, adapter_format format);
  // Whether the plan's lora(...) saves whole modules beside its adapters (modules_to_save).
  [[nodiscard]] bool saves_modules() const noexcept { return lora_ && !lora_->modules_to_save().empty(); }
  // Every rank reads the adapters from `path` in `format`, checked against the plan's lora(...).
  void load_adapter(const std::filesystem::path& path, adapter_format format);
  // `whole` (the state_dict) without the adapters, under pretrained(...)'s checkpoint's file names
  // (transformers' without one); rank 0 writes, every rank returns once it has.
  void save_weights(const std::filesystem::path& folder, const tensor_state& whole, std::int64_t max_shard_bytes);
  // `whole` in pretrained(...)'s dtypes, with its checkpoint's config and tokenizer files.
  void save_pretrained(const std::filesystem::path& folder, const tensor_state& whole, std::int64_t max_shard_bytes);

  // Clears the gradients of `parameters`, in place or to undefined.
  static void zero_grad(const std::vector<at::Tensor>& parameters, bool set_to_none);
  [[nodiscard]] std::string describe() const;
  [[nodiscard]] const std::string& plan_text() const noexcept { return plan_text_; }
  [[nodiscard]] const std::string& plan_state() const noexcept { return plan_state_; }
  [[nodiscard]] std::vector<std::string> frozen_names() const;
  [[nodiscard]] const std::optional<weights_fingerprint>& pretrained_fingerprint() const noexcept {
    return pretrained_fingerprint_;
  }

 private:
  // On the heap: engines and hooks keep its address, which must survive moving the job.
  std::unique_ptr<strategy_context> context_;
  std::string model_name_;
  std::optional<lora_layers> lora_;
  std::string plan_text_;
  std::string plan_state_;
  std::string built_text_;  // how the model was built: its dtype, the parameters held in fp32
  collective_schedule built_schedule_;
  forward_casting casting_;
  std::shared_ptr<nn::sequence_split> sequence_split_;
  std::shared_ptr<nn::tensor_split> tensor_split_;
  std::vector<std::string> recomputed_units_;
  at::ScalarType compute_type_;  // what the forward computes in: the policy's param, the built dtype, or fp32
  // The diffusers component that prefixes a diffusers LoRA file's keys, refused when M names none.
  [[nodiscard]] std::string_view diffusers_component(std::string_view what) const;

  // What a saved adapter names for PEFT and diffusers: the model's identity and pretrained(...)'s folder, if any.
  model_identity identity_;
  std::filesystem::path base_model_;
  weights_naming weights_naming_ = weights_naming::transformers;  // pretrained(...)'s, else transformers'
  std::map<std::string, at::ScalarType> pretrained_dtypes_;       // by tensor name, as its files hold them
  std::optional<weights_fingerprint> pretrained_fingerprint_;
};

}  // namespace detail

template <class M>
concept TorchModule = detail::module_holder<M> || std::derived_from<M, torch::nn::Module>;

template <class M, Engine E>
class job {
 public:
  job(detail::module_storage<M> model, runtime rt, std::optional<lora_layers> lora, std::string plan_text, E engine,
      const detail::build_decisions& decided = {})
      : model_(std::move(model)),
        core_(std::move(rt), model_.base(), std::string(detail::type_name<M>()), std::move(lora), std::move(plan_text),
              decided),
        engine_(std::move(engine)) {
    core_.set_up([this](strategy_context& context) { engine_.setup(context); }, engine_casts);
    strategy_context& context = core_.context();
    if (pretrained_checkpoint* checkpoint = context.initial_values().unread_checkpoint()) {
      hooks::with_full_parameters(
          engine_, context, [&] { checkpoint->copy_into(context.module(), &lora_adapter::is_adapter_parameter); });
      context.initial_values().mark_checkpoint_read();
    }
    core_.finish_initial_values();
  }

  // The user's module, typed. Under a strategy that shards parameters at rest (fsdp()), they hold
  // no bytes outside job.forward: call the model yourself inside with_whole_module.
  [[nodiscard]] M& module() noexcept { return model_.get(); }
  // Calls `use(module())` with every parameter whole, and returns what it returns: for calling the
  // model yourself (sampling, an evaluation of your own) under any strategy, as FSDP2's unshard() or
  // FSDP1's summon_full_params. A sharding strategy gathers the master weights first and takes each
  // rank's rows back after (changes made inside are kept); every rank calls it. Elsewhere it is
  // `use(module())`.
  template <class F>
  decltype(auto) with_whole_module(F&& use) {
    using result = std::invoke_result_t<F&, M&>;
    detail::returned<result> out;
    hooks::with_full_parameters(engine_, core_.context(), [&] { out.capture([&] { return use(model_.get()); }); });
    return out.take();
  }
  [[nodiscard]] E& strategy() noexcept { return engine_; }
  [[nodiscard]] const runtime& rt() const noexcept { return core_.context().world(); }
  // This process's place among the job's: rank 0 is the one that prints and writes what is written
  // once. Batches are chosen by data_rank() instead, which differs under sequence_parallel.
  [[nodiscard]] int rank() const noexcept { return rt().rank(); }
  [[nodiscard]] int world_size() const noexcept { return rt().world_size(); }
  // Which batches this rank reads: under sequence_parallel(k) the ranks of a group read the same
  // ones, so a recipe chooses them by data_rank() of data_world_size(), not by the rank.
  [[nodiscard]] int data_rank() const noexcept { return core_.data_rank(); }
  [[nodiscard]] int data_world_size() const noexcept { return core_.data_world_size(); }

  // M's forward with the strategy around it; returns what M's forward returns.
  template <class... Args>
  decltype(auto) forward(Args&&... args) {
    using result = decltype(model_->forward(std::forward<Args>(args)...));
    failpoint("step.forward");
    detail::returned<result> out;
    core_.run_part(
        pass_part::forward,
        [&] {
          engine_.before_forward(core_.context());
          std::optional<lora_layers::forward_guard> adapters;
          if (lora_layers* lora = core_.lora()) adapters.emplace(*lora);
          const detail::forward_casting& casting = core_.casting();
          if (casting.none()) {
            out.capture([&]() -> result { return model_->forward(std::forward<Args>(args)...); });
            return;
          }
          std::optional<autocast_scope> autocast;
          if (casting.autocast) autocast.emplace(rt().device().type(), *casting.autocast);
          out.capture([&]() -> result {
            if constexpr (std::is_void_v<result> || std::is_reference_v<result>) {
              return model_->forward(cast_floating(std::forward<Args>(args), casting.inputs)...);
            } else {
              return cast_floating(model_->forward(cast_floating(std::forward<Args>(args), casting.inputs)...),
                                   casting.output);
            }
          });
        },
        [this](std::exception_ptr error) { hooks::explain_forward_failure(engine_, core_.context(), error); });
    return out.take();
  }

  // Backward, and the strategy's gradient synchronisation completed.
  void backward(const at::Tensor& loss) {
    core_.run_part(pass_part::backward, [&] {
      hooks::before_backward(engine_, core_.context(), loss);
      loss.backward();
      engine_.after_backward(core_.context());
    });
  }

  // What the optimizer steps: the trainable parameters, or this rank's shards of them (and the
  // replicated adapters) under fsdp().
  [[nodiscard]] std::vector<at::Tensor> trainable_parameters() const {
    return hooks::optimizer_parameters(engine_, core_.context());
  }

  // Every parameter and buffer, whole, under any strategy (a sharding one gathers them, and under
  // tensor_parallel the tensor group its split ones); and back.
  [[nodiscard]] tensor_state state_dict() {
    tensor_state state;
    core_.run_outside_pass("state_dict()", [&] {
      state = hooks::full_state(engine_, core_.context());
      core_.gather_split(state);
    });
    return state;
  }
  // This rank's share of the parameters and buffers, not copied: everything under local() and
  // ddp(), this rank's flat shards (and the replicated adapters) under fsdp(); under tensor_parallel
  // of its slices.
  [[nodiscard]] tensor_state local_state_dict() { return hooks::local_state(engine_, core_.context()); }
  void load_state_dict(const tensor_state& state) {
    hooks::load_full_state(engine_, core_.context(), core_.split_parts(state));
  }
  // Takes back a local_state_dict() of this rank, saved from the same plan over as many ranks.
  void load_local_state_dict(const tensor_state& state) { hooks::load_local_state(engine_, core_.context(), state); }
  // This rank's shard of the sharded parameter `name` from its shards over another number of ranks
  // (a checkpoint saved so); nothing when `name` is not sharded.
  [[nodiscard]] std::optional<at::Tensor> reshard_local(const std::string& name,
                                                        const std::vector<at::Tensor>& shards) {
    return hooks::reshard_local(engine_, core_.context(), name, shards);
  }
  // Each parameter and buffer by name, as state_dict() holds it: its whole shape, and the dimension
  // tensor_parallel cuts, if any (what a checkpoint saved in another layout is put together by).
  [[nodiscard]] std::map<std::string, tensor_layout> whole_layouts() const { return core_.whole_layouts(); }
  // This rank's part of the parameter or buffer `name` from its `whole` values, as
  // local_state_dict() holds it: its slice under tensor_parallel, of that its flat shard under fsdp().
  [[nodiscard]] at::Tensor local_part(const std::string& name, const at::Tensor& whole) {
    const at::Tensor slice = core_.split_part(name, whole);
    return hooks::reshard_local(engine_, core_.context(), name, std::vector<at::Tensor>{slice}).value_or(slice);
  }
  // The names of what the optimizer steps, in trainable_parameters() order.
  [[nodiscard]] std::vector<std::string> trainable_names() const {
    std::vector<std::string> names;
    for (const named_tensor& t : core_.context().trainable()) names.push_back(t.name);
    return names;
  }
  // The names of the parameters that do not train, in registration order.
  [[nodiscard]] std::vector<std::string> frozen_names() const { return core_.frozen_names(); }
  // Whether each rank holds its own part of the state (fsdp) rather than a replica of the whole.
  [[nodiscard]] static constexpr bool shards_state() noexcept { return hooks::shards_parameters<E>(); }
  // Whether this rank's state is its own (a checkpoint saves every rank's): under fsdp, and under
  // tensor_parallel, whose ranks hold slices of the split parameters.
  [[nodiscard]] bool holds_own_state() const noexcept { return shards_state() || core_.splits_tensors(); }
  // The ranks each split layer is cut across: tensor_parallel's k, else 1.
  [[nodiscard]] int tensor_parallel_size() const noexcept { return core_.tensor_parallel_size(); }
  // How many ranks' shards make up one whole copy: the first that many ranks' local_state_dict()s
  // hold every row (the world size but under hybrid sharding, fsdp's shard_group_size).
  [[nodiscard]] int shard_group_size() const { return hooks::shard_group_size(engine_, core_.context()); }

  // Clears the trainable gradients, as torch::optim::Optimizer::zero_grad does (either works under
  // every strategy: no gradient loom hands out is an autograd view).
  void zero_grad(bool set_to_none = true) { detail::job_core::zero_grad(trainable_parameters(), set_to_none); }

  // Clips the gradients to a global p-norm of at most max_norm and returns the norm before clipping,
  // as torch.nn.utils.clip_grad_norm_ does: a 0-d tensor on the job's device, computed there, so the
  // host does not wait for it (read it with .item() when it is logged). Until loom 0.3.0 it also
  // converts to a double, deprecated, as 0.1.0 returned it (loom/job/gradient_norm.hpp).
  gradient_norm clip_grad_norm(double max_norm, double norm_type = 2.0) {
    at::Tensor norm;
    core_.run_outside_pass("gradient clipping",
                           [&] { norm = hooks::clip_grad_norm(engine_, core_.context(), max_norm, norm_type); });
    return {std::move(norm), rt()};
  }

  // Gradient accumulation: backward inside the guard's lifetime communicates nothing; the next
  // backward outside it reduces the accumulated gradients.
  class [[nodiscard]] no_sync_guard {
   public:
    explicit no_sync_guard(strategy_context& context) : context_(context), was_(context.sync_gradients()) {
      context_.set_sync_gradients(false);
    }
    ~no_sync_guard() { context_.set_sync_gradients(was_); }
    no_sync_guard(const no_sync_guard&) = delete;
    no_sync_guard& operator=(const no_sync_guard&) = delete;

   private:
    strategy_context& context_;
    bool was_;
  };
  no_sync_guard no_sync() { return no_sync_guard(core_.context()); }

  [[nodiscard]] const collective_schedule& schedule() const noexcept { return core_.context().schedule(); }
  [[nodiscard]] const collective_schedule& built_schedule() const noexcept { return core_.built_schedule(); }
  [[nodiscard]] std::uint64_t built_schedule_fingerprint() const { return core_.built_schedule_fingerprint(); }
  [[nodiscard]] std::string describe() const { return core_.describe(); }
  // The plan alone, as the DSL describes it: the same on every rank and at any world size.
  [[nodiscard]] const std::string& plan_text() const noexcept { return core_.plan_text(); }
  // The plan without its layout options (fsdp's shard_group_size): what a checkpoint compares.
  [[nodiscard]] const std::string& plan_state() const noexcept { return core_.plan_state(); }
  // pretrained(...)'s weights, by their files' digest (the same on every rank): what a checkpoint
  // records that the job was trained over. None without the stage.
  [[nodiscard]] const std::optional<weights_fingerprint>& pretrained_fingerprint() const noexcept {
    return core_.pretrained_fingerprint();
  }

  // LoRA: fold the adapters into the base weights, and take them out again.
  void merge() {
    lora_layers& lora = core_.require_lora("merge");
    hooks::with_full_parameters(engine_, core_.context(), [&] { lora.merge(); });
  }
  void unmerge() {
    lora_layers& lora = core_.require_lora("unmerge");
    hooks::with_full_parameters(engine_, core_.context(), [&] { lora.unmerge(); });
  }

  // The adapters as PEFT's LoRA folder (adapter_config.json, adapter_model.safetensors) that
  // PeftModel.from_pretrained loads, or, for a model that is a diffusers pipeline's component (Wan),
  // as diffusers' pytorch_lora_weights.safetensors that the pipeline's load_lora_weights and the
  // model's load_lora_adapter load; and back, from such a folder (or, for diffusers', a file of its
  // own name). A model of a pipeline's components (WanExperts) has one such folder a component,
  // folder/<component>/, its names the component's own (diffusers loads each with
  // load_lora_weights(folder, subfolder=component), transformer_2's with load_into_transformer_2).
  // docs/checkpoints.md. Every rank calls them.
  // With lora(...)'s modules_to_save, their parameters are read and written whole (a sharding
  // strategy gathers them for the call).
  void save_adapter(const std::filesystem::path& folder, adapter_format format = adapter_format::peft) {
    with_saved_modules([&] { core_.save_adapter(folder, format); });
  }
  void load_adapter(const std::filesystem::path& path, adapter_format format = adapter_format::peft) {
    with_saved_modules([&] { core_.load_adapter(path, format); });
  }

  // The base weights, whole, without the adapters (after merge(), a plain model with them folded
  // in), as safetensors in Hugging Face's layout (loom/io/weights.hpp), under the file names of
  // pretrained(...)'s checkpoint (diffusers' for a diffusers folder; transformers' without one), a
  // model of a pipeline's components (WanExperts) one folder a component, as pretrained(...) reads
  // them; every rank calls it.
  void save_weights(const std::filesystem::path& folder, std::int64_t max_shard_bytes = default_max_shard_bytes) {
    core_.save_weights(folder, state_dict(), max_shard_bytes);
  }
  // The model as from_pretrained reads it (save_pretrained's files): the base weights as save_weights
  // writes them (diffusion_pytorch_model.safetensors for a diffusers checkpoint, which
  // WanTransformer3DModel.from_pretrained reads), each in the dtype pretrained(...)'s checkpoint holds
  // it in, and that checkpoint's config.json, generation config and tokenizer files beside them (a
  // pipeline's components: each one's config.json in its folder, model_index.json and the
  // pipeline's other components, copied whole, beside them). LoRA's adapters must be merged first
  // (job.merge()); every rank calls it.
  void save_pretrained(const std::filesystem::path& folder, std::int64_t max_shard_bytes = default_max_shard_bytes) {
    core_.save_pretrained(folder, state_dict(), max_shard_bytes);
  }
  // Loads base weights by name (the adapters are left as they are): strict, every other parameter
  // and buffer must be there and nothing else; or not, reporting what it left alone.
  weights_report load_weights(const std::filesystem::path& path, bool strict = true) {
    const std::vector<named_tensor> weights = core_.split_parts(loom::load_weights(path));
    weights_report report;
    hooks::with_full_parameters(engine_, core_.context(), [&] {
      report = copy_weights(core_.context().module(), weights, strict, &lora_adapter::is_adapter_parameter);
    });
    return report;
  }

 private:
  static constexpr bool engine_casts = hooks::casts_parameters<E>();

  template <class F>
  void with_saved_modules(const F& body) {
    if (core_.saves_modules()) {
      hooks::with_full_parameters(engine_, core_.context(), body);
    } else {
      body();
    }
  }

  detail::module_storage<M> model_;
  detail::job_core core_;
  E engine_;
};

}  // namespace loom

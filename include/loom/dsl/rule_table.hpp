// The table of rules: every sentence loom prints for a broken plan, one row each. It is the single
// source of loom::violation, loom::sentence() and the checks that report a broken rule, while
// compiling (LOOM_STATIC_CHECK, detail::enforce) and at run time (plan_error); docs/rules.md lists the
// same rows, and test-dsl checks that it does.
//
// A row is X(id, sentence): `id` names the loom::violation enumerator, and the sentence reads
// "loom R<n>: <what is wrong>: <the fix> (<why>)", in ASCII (g++ prints other bytes of a template
// argument as octal escapes). Sentences are literals, and the checks macros that expand the table,
// because before C++26 a static_assert prints only a literal.
#pragma once

// g++ traces an error inside a macro expansion back through each macro, three lines a level, and a
// broken rule's diagnostic is held to 16 lines (docs/rules.md). Macros from a system header are not
// traced: the error is reported at the line that expands the check, as if it were written out there.
#pragma GCC system_header

// R3: lora and trainable come before the strategy. One template makes its six sentences: for each of
// the two stages, one per strategy that has a reason of its own, X(kind, why, ...), and a general one
// for any other strategy.
#define LOOM_R3_SENTENCE(stage, strategy, why) \
  "loom R3: " stage "(...) comes after " strategy ": put " stage " before the strategy (" why ")"
#define LOOM_R3_STRATEGIES(X, ...)                                                                         \
  X(ddp, "DDP builds its gradient reducer from the parameters that are trainable when it wraps the model", \
    __VA_ARGS__)                                                                                           \
  X(fsdp, "FSDP decides what to shard and what to replicate when it wraps the model", __VA_ARGS__)

#define LOOM_DETAIL_R3_NAMED(strategy, why, X, stage) \
  X(r3_##stage##_after_##strategy, LOOM_R3_SENTENCE(#stage, #strategy "()", why))
#define LOOM_DETAIL_R3_ROWS(X, stage)                \
  LOOM_R3_STRATEGIES(LOOM_DETAIL_R3_NAMED, X, stage) \
  X(r3_##stage##_after_strategy,                     \
    LOOM_R3_SENTENCE(#stage, "the strategy", "a strategy wraps the model as the stages before it leave it"))

// The sentences that a static_assert outside the table's checks names, so their rows name them too:
// strategy() checks R8 requirement by requirement, and loom::build checks R7 where the plan meets
// LibTorch.
#define LOOM_R7_NOT_A_MODULE                                                                      \
  "loom R7: model<M>(...) needs a LibTorch module: M must derive from torch::nn::Module or be a " \
  "ModuleHolder made by TORCH_MODULE(...)"
#define LOOM_R7_NOT_CONSTRUCTIBLE \
  "loom R7: M cannot be constructed from the arguments given to model<M>(...): pass what M's constructor takes"
#define LOOM_R7_NO_FORWARD                                                                       \
  "loom R7: M has no forward(...): add the forward that job.forward and loom::train call, e.g. " \
  "torch::Tensor forward(torch::Tensor tokens)"
#define LOOM_R8_NO_NAME                                                                       \
  "loom R8: the strategy has no static constexpr std::string_view name: add one (describe() " \
  "and the collective schedule name the strategy by it)"
#define LOOM_R8_NO_OPTIONS                                                                \
  "loom R8: the strategy has no options() const returning a string: add one (describe() " \
  "prints it; return an empty string when there are none)"
#define LOOM_R8_NO_SETUP                                                               \
  "loom R8: the strategy has no setup(loom::strategy_context&): add it (it wraps the " \
  "built module for the process group)"
#define LOOM_R8_NO_BEFORE_FORWARD                                                              \
  "loom R8: the strategy has no before_forward(loom::strategy_context&): add it (job.forward " \
  "calls it before the module's forward)"
#define LOOM_R8_NO_AFTER_BACKWARD                                                 \
  "loom R8: the strategy has no after_backward(loom::strategy_context&): add it " \
  "(job.backward calls it to finish the gradient synchronisation)"
#define LOOM_R8_NOT_COPYABLE \
  "loom R8: the strategy is not copy-constructible: make it copyable (a plan is a value and copies its stages)"

// R14: an engine's optional hooks, the one list of them: X(hook, result, (parameters), qualifier)
// for each, which loom/strategies/engine.hpp turns into the check that an engine's member matches,
// the call with the job's default when it has none, and which R14's sentences print as the
// signature to declare; and X(hook, why) for those a strategy that shards its parameters must have.
// The job calls a hook only with its signature, so a member of a hook's name that it cannot call so
// is an error, never a silent fallback to the default; and a sharding strategy without its state
// hooks would checkpoint and clip as if every rank held the whole model.
// Left unformatted: a signature is printed as it is spelled here.
// clang-format off
#define LOOM_ENGINE_HOOKS(X, ...)                                                                               \
  X(before_backward, void, (loom::strategy_context&, const at::Tensor& loss), , __VA_ARGS__)                     \
  X(optimizer_parameters, std::vector<at::Tensor>, (const loom::strategy_context&), const, __VA_ARGS__)          \
  X(clip_grad_norm, at::Tensor, (loom::strategy_context&, double max_norm, double norm_type), , __VA_ARGS__)     \
  X(explain_forward_failure, void, (loom::strategy_context&, std::exception_ptr), , __VA_ARGS__)                 \
  X(with_full_parameters, void, (loom::strategy_context&, const std::function<void()>& change), , __VA_ARGS__)   \
  X(full_state, loom::tensor_state, (loom::strategy_context&), , __VA_ARGS__)                                    \
  X(local_state, loom::tensor_state, (loom::strategy_context&), , __VA_ARGS__)                                   \
  X(load_full_state, void, (loom::strategy_context&, const loom::tensor_state&), , __VA_ARGS__)                  \
  X(load_local_state, void, (loom::strategy_context&, const loom::tensor_state&), , __VA_ARGS__)                 \
  X(reshard_local, std::optional<at::Tensor>,                                                                   \
    (loom::strategy_context&, const std::string& name, const std::vector<at::Tensor>& old_shards), , __VA_ARGS__) \
  X(shard_group_size, int, (const loom::strategy_context&), const, __VA_ARGS__)                                  \
  X(strategy_state, loom::tensor_state, (loom::strategy_context&), , __VA_ARGS__)                                \
  X(load_strategy_state, void, (loom::strategy_context&, const loom::tensor_state&), , __VA_ARGS__)
// clang-format on
// "void before_backward(loom::strategy_context&, const at::Tensor& loss)": a hook's row as its
// declaration reads.
#define LOOM_HOOK_SIGNATURE(hook, result, parameters, qualifier) \
#result " " #hook #parameters LOOM_DETAIL_HOOK_QUALIFIER_##qualifier
#define LOOM_DETAIL_HOOK_QUALIFIER_ ""
#define LOOM_DETAIL_HOOK_QUALIFIER_const " const"
#define LOOM_SHARDING_HOOKS(X, ...)                                                           \
  X(optimizer_parameters, "the optimizer steps this rank's shards", __VA_ARGS__)              \
  X(clip_grad_norm, "the global norm adds up every rank's shards", __VA_ARGS__)               \
  X(with_full_parameters, "merge and unmerge change whole parameters", __VA_ARGS__)           \
  X(full_state, "state_dict() and save_weights() give whole tensors", __VA_ARGS__)            \
  X(load_full_state, "load_state_dict() and load_weights() take whole tensors", __VA_ARGS__)  \
  X(local_state, "a checkpoint saves each rank's own shards, not whole tensors", __VA_ARGS__) \
  X(load_local_state, "a checkpoint loads each rank's own shards", __VA_ARGS__)               \
  X(reshard_local, "a checkpoint resumes over another number of ranks", __VA_ARGS__)
#define LOOM_R14_SIGNATURE(hook, signature)                                                           \
  "loom R14: the strategy's " #hook " does not match the hook of that name: declare it as " signature \
  " (the job calls a hook only so, and would otherwise skip it)"
#define LOOM_R14_SHARDING(hook, why)                                                          \
  "loom R14: the strategy shards its parameters (shards_parameters = true) but has no " #hook \
  ": add it as loom/strategies/engine.hpp declares it (" why ")"
#define LOOM_DETAIL_R14_SIGNATURE_ROW(hook, result, parameters, qualifier, X) \
  X(r14_##hook##_signature, LOOM_R14_SIGNATURE(hook, LOOM_HOOK_SIGNATURE(hook, result, parameters, qualifier)))
#define LOOM_DETAIL_R14_SHARDING_ROW(hook, why, X) X(r14_sharding_without_##hook, LOOM_R14_SHARDING(hook, why))
// Stops compilation once for each hook that the engine type E gets wrong (R14), with its sentence;
// expanded where E is known (loom::build), with loom/strategies/engine.hpp's concepts in scope.
#define LOOM_CHECK_ENGINE_HOOKS(E)                       \
  LOOM_ENGINE_HOOKS(LOOM_DETAIL_CHECK_HOOK_SIGNATURE, E) \
  LOOM_SHARDING_HOOKS(LOOM_DETAIL_CHECK_SHARDING_HOOK, E)
#define LOOM_DETAIL_CHECK_HOOK_SIGNATURE(hook, result, parameters, qualifier, E)       \
  static_assert(!::loom::hooks::names_##hook<E> || ::loom::hooks::overrides_##hook<E>, \
                LOOM_R14_SIGNATURE(hook, LOOM_HOOK_SIGNATURE(hook, result, parameters, qualifier)));
#define LOOM_DETAIL_CHECK_SHARDING_HOOK(hook, why, E)                                         \
  static_assert(!::loom::hooks::shards_parameters<E>() || ::loom::hooks::overrides_##hook<E>, \
                LOOM_R14_SHARDING(hook, why));
#define LOOM_DETAIL_R14_ROWS(X)                       \
  LOOM_ENGINE_HOOKS(LOOM_DETAIL_R14_SIGNATURE_ROW, X) \
  LOOM_SHARDING_HOOKS(LOOM_DETAIL_R14_SHARDING_ROW, X)

// X(id, sentence) for every rule, in the order of docs/rules.md.
#define LOOM_RULES(X)                                                                                           \
  /* R1: a plan starts with exactly one model<M>(). */                                                          \
  X(r1_no_model,                                                                                                \
    "loom R1: the plan has no model: start it with loom::model<M>(args...) "                                    \
    "(there is nothing to build without one)")                                                                  \
  X(r1_model_not_first,                                                                                         \
    "loom R1: model<M>(...) is not the first stage: start the plan with the model "                             \
    "and pipe the other stages into it")                                                                        \
  X(r1_two_models,                                                                                              \
    "loom R1: the plan has two models: keep one model<M>(...) (a plan builds exactly "                          \
    "one model)")                                                                                               \
  /* R2: at most one strategy, and it is the last stage. */                                                     \
  X(r2_two_strategies,                                                                                          \
    "loom R2: the plan has two strategies: keep one of local(), ddp(), fsdp() or "                              \
    "strategy(...) (one strategy wraps the whole model)")                                                       \
  X(r2_seeded_after_strategy,                                                                                   \
    "loom R2: seeded(...) comes after the strategy: the strategy is the "                                       \
    "last stage, so move seeded directly after model<M>(...)")                                                  \
  /* R3: lora / trainable come before the strategy. */                                                          \
  LOOM_DETAIL_R3_ROWS(X, lora)                                                                                  \
  LOOM_DETAIL_R3_ROWS(X, trainable)                                                                             \
  /* R4: seeded at most once, directly after model. */                                                          \
  X(r4_seeded_twice,                                                                                            \
    "loom R4: seeded(...) appears twice: keep one seed (it governs the model's "                                \
    "construction, which happens once)")                                                                        \
  X(r4_seeded_not_after_model,                                                                                  \
    "loom R4: seeded(...) is not directly after model<M>(...): move it "                                        \
    "there (the seed governs the model's construction, which comes first)")                                     \
  /* R5: the values of lora(...). */                                                                            \
  X(r5_rank_not_positive, "loom R5: lora rank must be > 0: pass a positive rank, e.g. lora(8)")                 \
  X(r5_alpha_not_positive,                                                                                      \
    "loom R5: lora alpha must be > 0: pass .alpha > 0, or leave it out to use "                                 \
    "the rank")                                                                                                 \
  X(r5_dropout_out_of_range,                                                                                    \
    "loom R5: lora dropout must be in [0, 1): pass .dropout >= 0 and < 1 "                                      \
    "(dropout 1 zeroes the adapter's input)")                                                                   \
  X(r5_no_targets,                                                                                              \
    "loom R5: lora targets are empty: name at least one module, or leave targets out "                          \
    "to use loom::default_targets")                                                                             \
  X(r5_empty_target, "loom R5: a lora target is empty: remove it or name a module")                             \
  X(r5_duplicate_target, "loom R5: a lora target is listed twice: remove the duplicate")                        \
  X(r5_empty_exclude, "loom R5: a lora exclude entry is empty: remove it or name a module")                     \
  X(r5_duplicate_exclude, "loom R5: a lora exclude entry is listed twice: remove the duplicate")                \
  X(r5_all_linear_not_alone,                                                                                    \
    "loom R5: loom::all_linear is a whole target list (every linear layer but the output head, PEFT's "         \
    "\"all-linear\"): give it alone, and leave layers out with .exclude")                                       \
  X(r5_empty_module_to_save, "loom R5: a lora modules_to_save entry is empty: remove it or name a module")      \
  X(r5_duplicate_module_to_save, "loom R5: a lora modules_to_save entry is listed twice: remove the duplicate") \
  X(r5_empty_pattern_key,                                                                                       \
    "loom R5: a lora rank_pattern or alpha_pattern key is empty: give a module's name or a regex of the end "   \
    "of its dotted name")                                                                                       \
  X(r5_duplicate_pattern_key,                                                                                   \
    "loom R5: a lora rank_pattern or alpha_pattern key is listed twice: keep one (the first key that matches "  \
    "a layer gives its value)")                                                                                 \
  X(r5_rank_pattern_value,                                                                                      \
    "loom R5: a lora rank_pattern value must be a whole number > 0: give each matched layer a positive rank")   \
  X(r5_alpha_pattern_value,                                                                                     \
    "loom R5: a lora alpha_pattern value must be > 0: give each matched layer a positive alpha")                \
  /* R6: at most one lora. */                                                                                   \
  X(r6_two_loras,                                                                                               \
    "loom R6: the plan has two lora(...) stages: keep one and list every target in it "                         \
    "(a plan carries one adapter set)")                                                                         \
  /* R7: a LibTorch module with a forward, constructible from the arguments; the DSL checks it is a class. */   \
  X(r7_model_not_class,                                                                                         \
    "loom R7: model<M>(...) needs a class type M: pass the module type, e.g. "                                  \
    "model<TinyGpt>(config)")                                                                                   \
  X(r7_not_a_module, LOOM_R7_NOT_A_MODULE)                                                                      \
  X(r7_not_constructible, LOOM_R7_NOT_CONSTRUCTIBLE)                                                            \
  X(r7_no_forward, LOOM_R7_NO_FORWARD)                                                                          \
  /* R8: a user-written strategy models loom::Strategy; one sentence per requirement. */                        \
  X(r8_no_name, LOOM_R8_NO_NAME)                                                                                \
  X(r8_no_options, LOOM_R8_NO_OPTIONS)                                                                          \
  X(r8_no_setup, LOOM_R8_NO_SETUP)                                                                              \
  X(r8_no_before_forward, LOOM_R8_NO_BEFORE_FORWARD)                                                            \
  X(r8_no_after_backward, LOOM_R8_NO_AFTER_BACKWARD)                                                            \
  X(r8_not_copyable, LOOM_R8_NOT_COPYABLE)                                                                      \
  /* R9: trainable needs a lora before it. */                                                                   \
  X(r9_trainable_without_lora,                                                                                  \
    "loom R9: trainable(...) has no lora(...) before it: put lora first "                                       \
    "(lora freezes the base model and trainable keeps more of it "                                              \
    "trainable; without lora every parameter is trainable already)")                                            \
  /* R10: at most one trainable. */                                                                             \
  X(r10_trainable_twice,                                                                                        \
    "loom R10: trainable(...) appears twice: list every pattern in one "                                        \
    "trainable(...)")                                                                                           \
  /* R11: the values of trainable(...). */                                                                      \
  X(r11_no_patterns,                                                                                            \
    "loom R11: trainable() has no patterns: name at least one module or parameter, "                            \
    "or remove the stage")                                                                                      \
  X(r11_empty_pattern, "loom R11: a trainable pattern is empty: remove it or name a module")                    \
  X(r11_duplicate_pattern, "loom R11: a trainable pattern is listed twice: remove the duplicate")               \
  /* R12: a target list is stored inline, so it has a fixed capacity. */                                        \
  X(r12_too_many_targets,                                                                                       \
    "loom R12: a target list holds at most 16 entries: match several modules "                                  \
    "with one loom::pattern(regex)")                                                                            \
  X(r12_too_many_pattern_keys,                                                                                  \
    "loom R12: a rank_pattern or alpha_pattern holds at most 16 keys: match several layers with one regex "     \
    "key")                                                                                                      \
  /* R13: the right side of | is a stage. */                                                                    \
  X(r13_not_a_stage,                                                                                            \
    "loom R13: the right side of | is not a loom stage: call the stage function, "                              \
    "e.g. loom::ddp() rather than loom::ddp")                                                                   \
  /* R14: an engine's optional hooks have their signatures; a sharding one has its state hooks. */              \
  LOOM_DETAIL_R14_ROWS(X)                                                                                       \
  /* R15: at most one mixed_precision, before the strategy. */                                                  \
  X(r15_two_mixed_precisions,                                                                                   \
    "loom R15: the plan has two mixed_precision(...) stages: keep one (one policy sets the dtypes of "          \
    "the whole model)")                                                                                         \
  X(r15_mixed_precision_after_strategy,                                                                         \
    "loom R15: mixed_precision(...) comes after the strategy: put it before the strategy (the "                 \
    "strategy decides, when it wraps the model, the dtype of each collective)")                                 \
  /* R16: the values of mixed_precision(...). */                                                                \
  X(r16_param_not_floating,                                                                                     \
    "loom R16: mixed_precision param is not a floating dtype: pass .param = loom::bf16 (forward and "           \
    "backward compute in it)")                                                                                  \
  X(r16_param_full_precision,                                                                                   \
    "loom R16: mixed_precision param is fp32 or wider, which computes in full precision already: pass "         \
    ".param = loom::bf16, or remove the stage")                                                                 \
  X(r16_fp16_without_loss_scaling,                                                                              \
    "loom R16: mixed_precision param fp16 needs loss scaling, which loom::train does not do: pass "             \
    ".param = loom::bf16 (fp16 gradients below 6e-8 underflow to zero unless the loss is scaled up; "           \
    "bf16 has fp32's range and needs no scaling)")                                                              \
  X(r16_reduce_not_floating,                                                                                    \
    "loom R16: mixed_precision reduce is not a floating dtype: pass .reduce = loom::fp32, the default "         \
    "(gradients are averaged in it)")                                                                           \
  X(r16_output_not_floating,                                                                                    \
    "loom R16: mixed_precision output is not a floating dtype: pass .output = loom::fp32, or leave it "         \
    "out to keep the dtype the forward computes in")                                                            \
  /* R17: default_dtype: floating, once, where the model is built. */                                           \
  X(r17_not_floating,                                                                                           \
    "loom R17: default_dtype(...) is not a floating dtype: pass loom::bf16, loom::fp16 or loom::fp32 "          \
    "(the model's parameters are built in it)")                                                                 \
  X(r17_default_dtype_twice, "loom R17: default_dtype(...) appears twice: keep one (the model is built once)")  \
  X(r17_default_dtype_not_after_model,                                                                          \
    "loom R17: default_dtype(...) is not directly after model<M>(...) or seeded(...): move it there "           \
    "(it sets the dtype the model is built in, and the model is built first)")                                  \
  /* R18: recompute: once, before the strategy, every k >= 1. */                                                \
  X(r18_two_recomputes,                                                                                         \
    "loom R18: the plan has two recompute(...) stages: keep one (one choice of units recomputes in the "        \
    "whole model)")                                                                                             \
  X(r18_recompute_after_strategy,                                                                               \
    "loom R18: recompute(...) comes after the strategy: put it before the strategy (the strategy wraps the "    \
    "units' forward and backward as the stages before it leave them)")                                          \
  X(r18_every_zero,                                                                                             \
    "loom R18: recompute every is 0: pass .every = 1 to recompute every unit, or k for every k-th "             \
    "one")                                                                                                      \
  /* R19: pretrained: once, after the model is built, before lora and the strategy. */                          \
  X(r19_two_pretrained,                                                                                         \
    "loom R19: the plan has two pretrained(...) stages: keep one (the model's weights come from one "           \
    "checkpoint)")                                                                                              \
  X(r19_pretrained_after_lora,                                                                                  \
    "loom R19: pretrained(...) comes after lora(...): put pretrained first (lora adapts the weights the "       \
    "checkpoint gives, and its adapters are not in the checkpoint)")                                            \
  X(r19_pretrained_after_strategy,                                                                              \
    "loom R19: pretrained(...) comes after the strategy: put it before the strategy (the strategy shards or "   \
    "replicates the weights it finds when it wraps the model)")                                                 \
  X(r19_empty_path, "loom R19: pretrained path is empty: give the checkpoint's folder or .safetensors file")    \
  /* R20: sequence_parallel: once, before the strategy, k >= 1. */                                              \
  X(r20_two_sequence_parallels,                                                                                 \
    "loom R20: the plan has two sequence_parallel(...) stages: keep one (one group size splits every "          \
    "sequence)")                                                                                                \
  X(r20_sequence_parallel_after_strategy,                                                                       \
    "loom R20: sequence_parallel(...) comes after the strategy: put it before the strategy (the strategy "      \
    "averages and shards over the ranks the sequence groups leave it)")                                         \
  X(r20_size_zero,                                                                                              \
    "loom R20: sequence_parallel size is 0: pass 1 to split no sequence, or k to split each over k ranks")      \
  /* R21: quantized: once, after pretrained, before lora and the strategy, with adapters to train. */           \
  X(r21_two_quantized,                                                                                          \
    "loom R21: the plan has two quantized(...) stages: keep one (the base is quantized once, in one "           \
    "format)")                                                                                                  \
  X(r21_quantized_before_pretrained,                                                                            \
    "loom R21: quantized(...) comes before pretrained(...): put pretrained first (the checkpoint's weights "    \
    "are quantized as they are read)")                                                                          \
  X(r21_quantized_after_lora,                                                                                   \
    "loom R21: quantized(...) comes after lora(...) or trainable(...): put it before lora (the base is "        \
    "quantized, the adapters added over it stay in full precision)")                                            \
  X(r21_quantized_after_strategy,                                                                               \
    "loom R21: quantized(...) comes after the strategy: put it before the strategy (the strategy shards or "    \
    "replicates the quantized bytes it finds when it wraps the model)")                                         \
  X(r21_quantized_without_lora,                                                                                 \
    "loom R21: quantized(...) without lora(...) leaves nothing to train (a quantized weight is frozen): add "   \
    "lora(r, targets) after it, as QLoRA does")                                                                 \
  X(r21_block_size,                                                                                             \
    "loom R21: quantized block_size is not a power of two from 32 to 4096, which bitsandbytes' nf4 takes: "     \
    "pass .block_size = 64, the default")                                                                       \
  /* R22: tensor_parallel: once, before the strategy, k >= 1, with no sequence split and no quantized base. */  \
  X(r22_two_tensor_parallels,                                                                                   \
    "loom R22: the plan has two tensor_parallel(...) stages: keep one (one group size splits every layer)")     \
  X(r22_tensor_parallel_after_strategy,                                                                         \
    "loom R22: tensor_parallel(...) comes after the strategy: put it before the strategy (the strategy "        \
    "averages and shards over the ranks the tensor-parallel groups leave it)")                                  \
  X(r22_size_zero,                                                                                              \
    "loom R22: tensor_parallel size is 0: pass 1 to split no layer, or k to split each layer over k ranks")     \
  X(r22_with_sequence_parallel,                                                                                 \
    "loom R22: tensor_parallel(...) and sequence_parallel(...) both split the ranks, and both splits on one "   \
    "mesh are not supported yet: keep one, or give the other size 1 (sequence_parallel splits the tokens, "     \
    "tensor_parallel the layers)")                                                                              \
  X(r22_with_quantized,                                                                                         \
    "loom R22: tensor_parallel(...) and quantized(...) are in one plan: drop quantized or tensor_parallel (a "  \
    "quantized base's blocks are not split across ranks yet)")

// Stops compilation, with the sentence of its argument (a constant loom::violation) on the first
// error line, unless that is violation::none: a static_assert per row, each with its sentence.
#define LOOM_STATIC_CHECK(...)                                    \
  do {                                                            \
    constexpr ::loom::violation loom_broken_rule = (__VA_ARGS__); \
    LOOM_RULES(LOOM_DETAIL_ASSERT_NOT_BROKEN)                     \
  } while (false)
#define LOOM_DETAIL_ASSERT_NOT_BROKEN(id, sentence) static_assert(loom_broken_rule != ::loom::violation::id, sentence);

// The cases of detail::enforce: each row's violation calls report_error<its sentence>.
#define LOOM_DETAIL_REPORT_CASE(id, sentence) \
  case ::loom::violation::id: ::loom::detail::report_error<sentence>(::loom::violation::id);

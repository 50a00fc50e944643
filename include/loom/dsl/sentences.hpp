// Every rule's sentence, written once.
//
// They are macros because a static_assert message must be a string literal before C++26; the
// compile-time diagnostics (static_assert, report_error<"...">) and the run-time checks
// (loom::sentence, loom::plan_error) all read these literals, so both paths say the same thing.
// Sentences are ASCII: g++ prints other bytes of a template argument as octal escapes.
// Shape: "loom R<n>: <what is wrong>: <the fix> (<why>)".
#pragma once

// R1: a plan starts with exactly one model<M>().
#define LOOM_R1_NO_MODEL \
  "loom R1: the plan has no model: start it with loom::model<M>(args...) (there is nothing to build without one)"
#define LOOM_R1_MODEL_NOT_FIRST \
  "loom R1: model<M>(...) is not the first stage: start the plan with the model and pipe the other stages into it"
#define LOOM_R1_TWO_MODELS \
  "loom R1: the plan has two models: keep one model<M>(...) (a plan builds exactly one model)"

// R2: at most one strategy, and it is the last stage.
#define LOOM_R2_TWO_STRATEGIES                                                                  \
  "loom R2: the plan has two strategies: keep one of local(), ddp(), fsdp() or strategy(...) " \
  "(one strategy wraps the whole model)"
#define LOOM_R2_SEEDED_AFTER_STRATEGY                                                         \
  "loom R2: seeded(...) comes after the strategy: the strategy is the last stage, so move " \
  "seeded directly after model<M>(...)"

// R3: lora / trainable come before the strategy.
#define LOOM_R3_LORA_AFTER_DDP                                                              \
  "loom R3: lora(...) comes after ddp(): put lora before the strategy (DDP builds its " \
  "gradient reducer from the parameters that are trainable when it wraps the model)"
#define LOOM_R3_LORA_AFTER_FSDP                                                              \
  "loom R3: lora(...) comes after fsdp(): put lora before the strategy (FSDP decides what " \
  "to shard and what to replicate when it wraps the model)"
#define LOOM_R3_LORA_AFTER_STRATEGY                                                            \
  "loom R3: lora(...) comes after the strategy: put lora before the strategy (a strategy " \
  "wraps the model as the stages before it leave it)"
#define LOOM_R3_TRAINABLE_AFTER_DDP                                                              \
  "loom R3: trainable(...) comes after ddp(): put trainable before the strategy (DDP builds " \
  "its gradient reducer from the parameters that are trainable when it wraps the model)"
#define LOOM_R3_TRAINABLE_AFTER_FSDP                                                          \
  "loom R3: trainable(...) comes after fsdp(): put trainable before the strategy (FSDP " \
  "decides what to shard and what to replicate when it wraps the model)"
#define LOOM_R3_TRAINABLE_AFTER_STRATEGY                                                     \
  "loom R3: trainable(...) comes after the strategy: put trainable before the strategy " \
  "(a strategy wraps the model as the stages before it leave it)"

// R4: seeded at most once, directly after model.
#define LOOM_R4_SEEDED_TWICE \
  "loom R4: seeded(...) appears twice: keep one seed (it governs the model's construction, which happens once)"
#define LOOM_R4_SEEDED_NOT_AFTER_MODEL                                                         \
  "loom R4: seeded(...) is not directly after model<M>(...): move it there (the seed governs " \
  "the model's construction, which comes first)"

// R5: the values of lora(...).
#define LOOM_R5_RANK_NOT_POSITIVE "loom R5: lora rank must be > 0: pass a positive rank, e.g. lora(8)"
#define LOOM_R5_ALPHA_NOT_POSITIVE \
  "loom R5: lora alpha must be > 0: pass .alpha > 0, or leave it out to use the rank"
#define LOOM_R5_DROPOUT_OUT_OF_RANGE \
  "loom R5: lora dropout must be in [0, 1): pass .dropout >= 0 and < 1 (dropout 1 zeroes the adapter's input)"
#define LOOM_R5_NO_TARGETS                                                              \
  "loom R5: lora targets are empty: name at least one module, or leave targets out to " \
  "use loom::default_targets"
#define LOOM_R5_EMPTY_TARGET "loom R5: a lora target is empty: remove it or name a module"
#define LOOM_R5_DUPLICATE_TARGET "loom R5: a lora target is listed twice: remove the duplicate"
#define LOOM_R5_EMPTY_EXCLUDE "loom R5: a lora exclude entry is empty: remove it or name a module"
#define LOOM_R5_DUPLICATE_EXCLUDE "loom R5: a lora exclude entry is listed twice: remove the duplicate"

// R6: at most one lora.
#define LOOM_R6_TWO_LORAS \
  "loom R6: the plan has two lora(...) stages: keep one and list every target in it (a plan carries one adapter set)"

// R7: the model type. The DSL checks only that M is a class; the runtime checks the rest.
#define LOOM_R7_MODEL_NOT_CLASS \
  "loom R7: model<M>(...) needs a class type M: pass the module type, e.g. model<TinyGpt>(config)"

// R8: a user-written strategy models loom::Strategy; one sentence per requirement.
#define LOOM_R8_NO_NAME                                                                          \
  "loom R8: the strategy has no static constexpr std::string_view name: add one (describe() " \
  "and the collective schedule name the strategy by it)"
#define LOOM_R8_NO_OPTIONS                                                                   \
  "loom R8: the strategy has no options() const returning a string: add one (describe() " \
  "prints it; return an empty string when there are none)"
#define LOOM_R8_NO_SETUP                                                               \
  "loom R8: the strategy has no setup(loom::strategy_context&): add it (it wraps the " \
  "built module for the process group)"
#define LOOM_R8_NO_BEFORE_FORWARD                                                             \
  "loom R8: the strategy has no before_forward(loom::strategy_context&): add it (job.forward " \
  "calls it before the module's forward)"
#define LOOM_R8_NO_AFTER_BACKWARD                                                       \
  "loom R8: the strategy has no after_backward(loom::strategy_context&): add it " \
  "(job.backward calls it to finish the gradient synchronisation)"
#define LOOM_R8_NOT_COPYABLE \
  "loom R8: the strategy is not copy-constructible: make it copyable (a plan is a value and copies its stages)"

// R9: trainable needs a lora before it.
#define LOOM_R9_TRAINABLE_WITHOUT_LORA                                                          \
  "loom R9: trainable(...) has no lora(...) before it: put lora first (lora freezes the base " \
  "model and trainable keeps more of it trainable; without lora every parameter is trainable already)"

// R10: at most one trainable.
#define LOOM_R10_TRAINABLE_TWICE \
  "loom R10: trainable(...) appears twice: list every pattern in one trainable(...)"

// R11: the values of trainable(...).
#define LOOM_R11_NO_PATTERNS \
  "loom R11: trainable() has no patterns: name at least one module or parameter, or remove the stage"
#define LOOM_R11_EMPTY_PATTERN "loom R11: a trainable pattern is empty: remove it or name a module"
#define LOOM_R11_DUPLICATE_PATTERN "loom R11: a trainable pattern is listed twice: remove the duplicate"

// R12: a target list has a fixed capacity (it is stored inline, so plans stay constexpr).
#define LOOM_R12_TOO_MANY_TARGETS \
  "loom R12: a target list holds at most 16 entries: match several modules with one loom::pattern(regex)"

// R13: the right side of | is a stage.
#define LOOM_R13_NOT_A_STAGE \
  "loom R13: the right side of | is not a loom stage: call the stage function, e.g. loom::ddp() rather than loom::ddp"

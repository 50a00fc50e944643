// loom's plan DSL: typed training pipelines, checked while compiling, without LibTorch.
//
//   constexpr auto plan = loom::model<TinyGpt>(config)
//                       | loom::seeded(42)
//                       | loom::lora(16, {"q_proj", "v_proj"})
//                       | loom::ddp();
//   std::cout << plan.describe();
//
// docs/dsl.md lists the stages and their options, docs/rules.md the rules.
#pragma once

// First, so that a rule's diagnostic reaches the table in one include step (docs/rules.md's budget).
#include <loom/dsl/rule_table.hpp>

#include <loom/dsl/data_parallel.hpp>
#include <loom/dsl/default_dtype.hpp>
#include <loom/dsl/deprecated_accessors.hpp>
#include <loom/dsl/describe.hpp>
#include <loom/dsl/diagnostics.hpp>
#include <loom/dsl/dtype.hpp>
#include <loom/dsl/lora.hpp>
#include <loom/dsl/mixed_precision.hpp>
#include <loom/dsl/model.hpp>
#include <loom/dsl/options.hpp>
#include <loom/dsl/pipe.hpp>
#include <loom/dsl/plan.hpp>
#include <loom/dsl/pretrained.hpp>
#include <loom/dsl/quantized.hpp>
#include <loom/dsl/recompute.hpp>
#include <loom/dsl/rules.hpp>
#include <loom/dsl/run_plan.hpp>
#include <loom/dsl/seeded.hpp>
#include <loom/dsl/sequence_parallel.hpp>
#include <loom/dsl/stage_kind.hpp>
#include <loom/dsl/stage_list.hpp>
#include <loom/dsl/strategies.hpp>
#include <loom/dsl/strategy.hpp>
#include <loom/dsl/targets.hpp>
#include <loom/dsl/tensor_parallel.hpp>
#include <loom/dsl/trainable.hpp>
#include <loom/dsl/violation.hpp>

#pragma once
// Everything a recipe needs: the plan DSL, the runtime, build() and the job, the built-in
// strategies' engines, loom::train, run files, checkpoints, loom::nn (Linear, Embedding, Unit) and
// loom::optim::AdamW.

#include <loom/checkpoint/checkpoint.hpp>
#include <loom/config/run_file.hpp>
#include <loom/dsl.hpp>
#include <loom/io/peft.hpp>
#include <loom/io/safetensors.hpp>
#include <loom/job/build.hpp>
#include <loom/nn/at_rest.hpp>
#include <loom/nn/embedding.hpp>
#include <loom/nn/linear.hpp>
#include <loom/nn/unit.hpp>
#include <loom/optim/adamw.hpp>
#include <loom/quant/fp8.hpp>
#include <loom/quant/nf4.hpp>
#include <loom/runtime/failures.hpp>
#include <loom/runtime/runtime.hpp>
#include <loom/schedule/cursor.hpp>
#include <loom/strategies/ddp.hpp>
#include <loom/strategies/fsdp.hpp>
#include <loom/strategies/local.hpp>
#include <loom/train/ema.hpp>
#include <loom/train/euler_sampler.hpp>
#include <loom/train/flow_matching.hpp>
#include <loom/train/loop.hpp>
#include <loom/train/lr_schedule.hpp>

#pragma once
// Everything a recipe needs: the plan DSL, the runtime, build() and the job, loom::nn::Linear.

#include <loom/build.hpp>
#include <loom/dsl.hpp>
#include <loom/nn/linear.hpp>
#include <loom/runtime.hpp>
#include <loom/runtime/failures.hpp>

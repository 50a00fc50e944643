#pragma once
// loom 0.1.0's home of loom's voice (error_message, throw_error, counted, ...), kept deprecated through
// 0.2.0 so that a program that includes it still compiles: the voice is the base wing's now, which
// every wing speaks from. It goes in loom 0.3.0 (docs/changes.md).

#pragma GCC warning "loom/runtime/text.hpp is deprecated: include <loom/base/text.hpp>; it goes in loom 0.3.0"

#include <loom/base/text.hpp>

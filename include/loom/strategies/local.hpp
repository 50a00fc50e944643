#pragma once
// local(): one process, nothing to synchronise.

#include <loom/dsl/strategies.hpp>
#include <loom/strategies/strategy_context.hpp>

#include <string_view>

namespace loom {

class local_engine {
 public:
  static constexpr std::string_view name = "local";

  void setup(strategy_context& context);
  void before_forward(strategy_context&) {}
  void after_backward(strategy_context&) {}
};

inline local_engine make_engine(const local_stage&) { return {}; }

}  // namespace loom

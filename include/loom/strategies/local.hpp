#pragma once
// local(): one process, nothing to synchronise.

#include <loom/strategy_context.hpp>

#include <string>
#include <string_view>

namespace loom {

class local_engine {
 public:
  static constexpr std::string_view name = "local";

  [[nodiscard]] std::string options() const { return {}; }
  void setup(strategy_context& context);
  void before_forward(strategy_context&) {}
  void after_backward(strategy_context&) {}
};

}  // namespace loom

#include <loom/strategies/local.hpp>

#include <fmt/format.h>

namespace loom {

void local_engine::setup(strategy_context& context) {
  if (context.rt().world_size() > 1) {
    context.note(fmt::format("local: each of the {} ranks trains on its own, nothing is synchronised",
                             context.rt().world_size()));
  }
}

}  // namespace loom

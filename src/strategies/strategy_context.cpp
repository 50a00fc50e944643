#include <loom/strategies/strategy_context.hpp>

#include <loom/base/text.hpp>
#include <loom/runtime/failures.hpp>

#include <fmt/format.h>

#include <stdexcept>

namespace loom {

strategy_context::strategy_context(runtime rt, std::shared_ptr<torch::nn::Module> module,
                                   std::optional<precision_policy> precision, std::optional<runtime> world)
    : runtime_(std::move(rt)), world_(std::move(world)), module_(std::move(module)), precision_(precision) {
  for (const auto& item : module_->named_parameters()) {
    if (item.value().requires_grad()) trainable_.push_back({item.key(), item.value()});
  }
}

void strategy_context::require_process_group(std::string_view strategy) const {
  if (runtime_.world_size() == 1 || runtime_.process_group()) return;
  throw_error<std::invalid_argument>(
      "{}(): world size {} needs a process group: create the runtime with loom::runtime::from_env() in a "
      "program started by loom-run or torchrun",
      strategy, runtime_.world_size());
}

void strategy_context::fail(const std::string& message) const { runtime_.failures().fail(message); }

}  // namespace loom

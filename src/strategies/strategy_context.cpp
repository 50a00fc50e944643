#include <loom/strategies/strategy_context.hpp>

#include <loom/runtime/failures.hpp>

namespace loom {

strategy_context::strategy_context(runtime rt, std::shared_ptr<torch::nn::Module> module)
    : runtime_(std::move(rt)), module_(std::move(module)) {
  for (const auto& item : module_->named_parameters()) {
    if (item.value().requires_grad()) trainable_.push_back({item.key(), item.value()});
  }
}

void strategy_context::fail(const std::string& message) const { fail_job(runtime_, message); }

}  // namespace loom

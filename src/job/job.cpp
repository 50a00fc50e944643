#include <loom/job.hpp>
#include <loom/runtime/failures.hpp>
#include <loom/strategies/local.hpp>

#include <fmt/format.h>
#include <torch/nn/utils/clip_grad.h>

#include <stdexcept>

namespace loom {

strategy_context::strategy_context(runtime rt, std::shared_ptr<torch::nn::Module> module)
    : runtime_(std::move(rt)), module_(std::move(module)) {
  for (const auto& item : module_->named_parameters()) {
    if (item.value().requires_grad()) trainable_.push_back({item.key(), item.value()});
  }
}

void strategy_context::fail(const std::string& message) const { fail_job(runtime_, message); }

void local_engine::setup(strategy_context& context) {
  if (context.rt().is_distributed()) {
    context.note(fmt::format("local: each of the {} ranks trains on its own, nothing is synchronised",
                             context.rt().world_size()));
  }
}

namespace detail {

job_core::job_core(runtime rt, std::shared_ptr<torch::nn::Module> module, std::optional<lora_layers> lora,
                   std::string plan_text)
    : context_(std::move(rt), std::move(module)), lora_(std::move(lora)), plan_text_(std::move(plan_text)) {}

void job_core::verify_schedule() const { verify_schedule_across_ranks(context_.schedule(), context_.rt()); }

void job_core::fail_step(std::string_view during) const {
  rethrow_as_job_failure(context_.rt(), std::current_exception(), during);
}

std::vector<at::Tensor> job_core::trainable_parameters() const {
  std::vector<at::Tensor> tensors;
  for (const named_parameter& p : context_.trainable()) tensors.push_back(p.tensor);
  return tensors;
}

void job_core::zero_grad(bool set_to_none) {
  for (const named_parameter& p : context_.trainable()) {
    at::Tensor& grad = p.tensor.mutable_grad();
    if (!grad.defined()) continue;
    if (set_to_none) {
      grad.reset();
    } else {
      grad.zero_();
    }
  }
}

double job_core::clip_grad_norm(double max_norm, double norm_type) const {
  // After ddp's all-reduce every rank holds the same gradients, so the local norm is the global one.
  return torch::nn::utils::clip_grad_norm_(trainable_parameters(), max_norm, norm_type);
}

std::string job_core::describe() const {
  std::int64_t total = 0;
  std::int64_t trainable = 0;
  for (const auto& p : context_.module().parameters()) {
    total += p.numel();
    if (p.requires_grad()) trainable += p.numel();
  }
  std::string text = plan_text_;
  text += fmt::format("build: {} on {} rank(s), device {}\n", context_.module().name(), context_.rt().world_size(),
                      context_.rt().device().str());
  if (lora_) {
    text += fmt::format("build: lora adapted {} layers ({} on the loom::nn::Linear fast path, {} on the "
                        "torch::nn::Linear fallback)\n",
                        lora_->adapted().size(), lora_->fast_path_count(), lora_->fallback_count());
  }
  text += fmt::format("build: {} of {} parameters trainable ({} tensors)\n", trainable, total,
                      context_.trainable().size());
  for (const std::string& line : context_.notes()) text += "build: " + line + '\n';
  text += fmt::format("build: schedule {} collectives a step, {} bytes, fingerprint {:016x}\n",
                      context_.schedule().entries().size(), context_.schedule().bytes_per_step(),
                      context_.schedule().fingerprint());
  return text;
}

}  // namespace detail
}  // namespace loom

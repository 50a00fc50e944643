#include <loom/job/job.hpp>

#include <loom/runtime/failures.hpp>
#include <loom/runtime/text.hpp>

#include <fmt/format.h>

#include <stdexcept>

namespace loom {

namespace detail {

job_core::job_core(runtime rt, std::shared_ptr<torch::nn::Module> module, std::string model_name,
                   std::optional<lora_layers> lora, std::string plan_text)
    : context_(std::move(rt), std::move(module)),
      model_name_(std::move(model_name)),
      lora_(std::move(lora)),
      plan_text_(std::move(plan_text)) {}

void job_core::verify_schedule() const { verify_schedule_across_ranks(context_.schedule(), context_.rt()); }

void job_core::fail_step(std::string_view during) const {
  rethrow_as_job_failure(context_.rt(), std::current_exception(), during);
}

void job_core::zero_grad(const std::vector<at::Tensor>& parameters, bool set_to_none) {
  for (const at::Tensor& p : parameters) {
    at::Tensor& grad = p.mutable_grad();
    if (!grad.defined()) continue;
    if (set_to_none) {
      grad.reset();
    } else {
      grad.zero_();
    }
  }
}

std::string job_core::describe() const {
  std::int64_t total = 0;
  std::int64_t trainable = 0;
  for (const auto& p : context_.module().parameters()) {
    total += p.numel();
    if (p.requires_grad()) trainable += p.numel();
  }
  std::string text = plan_text_;
  const runtime& rt = context_.rt();
  text += fmt::format("build: {} on {}, device {}\n", model_name_, counted(rt.world_size(), "rank"), rt.device().str());
  if (lora_) {
    text += fmt::format(
        "build: lora adapted {} ({} on the loom::nn::Linear fast path, {} on the torch::nn::Linear "
        "fallback)\n",
        counted(static_cast<std::int64_t>(lora_->adapted().size()), "layer"), lora_->fast_path_count(),
        lora_->fallback_count());
  }
  text += fmt::format("build: {} of {} parameters trainable ({})\n", trainable, total,
                      counted(static_cast<std::int64_t>(context_.trainable().size()), "tensor"));
  for (const std::string& line : context_.notes()) text += "build: " + line + '\n';
  const collective_schedule& schedule = context_.schedule();
  text += fmt::format("build: schedule {} a step, {} bytes, fingerprint {:016x}\n",
                      counted(static_cast<std::int64_t>(schedule.entries().size()), "collective"),
                      schedule.bytes_per_step(), schedule.fingerprint());
  return text;
}

}  // namespace detail
}  // namespace loom

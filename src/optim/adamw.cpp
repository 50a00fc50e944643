#include <loom/optim/adamw.hpp>

#include <loom/base/text.hpp>

#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/scalar_tensor.h>

#include <fmt/ranges.h>

#include <stdexcept>
#include <tuple>
#include <vector>

namespace loom::optim {
namespace {

// The kernel's arguments for the parameters that share a device, a dtype and a step count: its
// step is one number for all of them, and each call runs on one device.
struct fused_batch {
  c10::Device device;
  at::ScalarType dtype;
  std::int64_t step;
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs;
};

fused_batch& batch_for(std::vector<fused_batch>& batches, const at::Tensor& param, std::int64_t step) {
  for (fused_batch& batch : batches) {
    if (batch.device == param.device() && batch.dtype == param.scalar_type() && batch.step == step) return batch;
  }
  return batches.emplace_back(fused_batch{param.device(), param.scalar_type(), step, {}, {}, {}, {}, {}});
}

// The kernel walks a parameter, its gradient and its moments as one flat run of memory each, so
// they must be dense and laid out alike; a gradient laid out otherwise is copied into the
// parameter's layout (the moments have it: they are made with zeros_like).
at::Tensor gradient_in_layout_of(const at::Tensor& param, std::size_t group, std::size_t index) {
  const at::Tensor& grad = param.grad();
  if (grad.is_sparse()) {
    throw_error<std::invalid_argument>(
        "loom::optim::AdamW: parameter {} of group {} has a sparse gradient, which AdamW does not support (as "
        "torch::optim::AdamW): make its layer produce a dense gradient (torch::nn::Embedding's sparse = false)",
        index, group);
  }
  if (!param.is_non_overlapping_and_dense()) {
    throw_error<std::invalid_argument>(
        "loom::optim::AdamW: parameter {} of group {} (sizes [{}], strides [{}]) overlaps itself or has gaps, which "
        "the fused "
        "kernel cannot step in place: make the parameter a tensor of its own (clone it), or step it with "
        "torch::optim::AdamW",
        index, group, fmt::join(param.sizes(), ", "), fmt::join(param.strides(), ", "));
  }
  if (grad.strides() == param.strides()) return grad;
  return at::empty_like(param).copy_(grad);
}

}  // namespace

torch::Tensor AdamW::step(LossClosure closure) {
  at::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (std::size_t g = 0; g < param_groups_.size(); ++g) {
    torch::optim::OptimizerParamGroup& group = param_groups_[g];
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    std::vector<fused_batch> batches;
    for (std::size_t i = 0; i < group.params().size(); ++i) {
      const at::Tensor& param = group.params()[i];
      if (!param.grad().defined()) continue;
      at::Tensor grad = gradient_in_layout_of(param, g, i);
      auto& slot = state_[param.unsafeGetTensorImpl()];
      if (!slot) {
        auto fresh = std::make_unique<torch::optim::AdamWParamState>();
        fresh->exp_avg(at::zeros_like(param, at::MemoryFormat::Preserve));
        fresh->exp_avg_sq(at::zeros_like(param, at::MemoryFormat::Preserve));
        if (options.amsgrad()) fresh->max_exp_avg_sq(at::zeros_like(param, at::MemoryFormat::Preserve));
        slot = std::move(fresh);
      }
      auto& state = static_cast<torch::optim::AdamWParamState&>(*slot);
      state.step(state.step() + 1);
      fused_batch& batch = batch_for(batches, param, state.step());
      batch.params.push_back(param);
      batch.grads.push_back(std::move(grad));
      batch.exp_avgs.push_back(state.exp_avg());
      batch.exp_avg_sqs.push_back(state.exp_avg_sq());
      if (options.amsgrad()) batch.max_exp_avg_sqs.push_back(state.max_exp_avg_sq());
    }
    const auto [beta1, beta2] = options.betas();
    for (const fused_batch& batch : batches) {
      // The kernel reads the step from a float tensor on the parameters' device, as PyTorch's fused
      // AdamW keeps it; one tensor serves the whole batch.
      const at::Tensor step =
          at::scalar_tensor(static_cast<double>(batch.step), at::dtype(at::kFloat).device(batch.device));
      const std::vector<at::Tensor> steps(batch.params.size(), step);
      at::_fused_adamw_(batch.params, batch.grads, batch.exp_avgs, batch.exp_avg_sqs, batch.max_exp_avg_sqs, steps,
                        options.lr(), beta1, beta2, options.weight_decay(), options.eps(), options.amsgrad(),
                        /*maximize=*/false);
    }
  }
  return loss;
}

}  // namespace loom::optim

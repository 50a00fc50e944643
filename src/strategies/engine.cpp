#include <loom/strategies/engine.hpp>

#include <loom/base/text.hpp>
#include <loom/nn/tensor_parallel.hpp>
#include <loom/runtime/tensor_group.hpp>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <fmt/format.h>

#include <cmath>
#include <map>
#include <stdexcept>
#include <vector>

namespace loom::hooks {

std::vector<at::Tensor> trainable_tensors(const strategy_context& context) {
  std::vector<at::Tensor> tensors;
  for (const named_tensor& p : context.trainable()) tensors.push_back(p.tensor);
  return tensors;
}

namespace {

bool infinite(double norm_type) { return std::isinf(norm_type) && norm_type > 0; }

// The gradients of `parameters` that exist, by dtype: what one foreach kernel takes.
std::map<at::ScalarType, std::vector<at::Tensor>> grads_by_dtype(const std::vector<at::Tensor>& parameters) {
  std::map<at::ScalarType, std::vector<at::Tensor>> grads;
  for (const at::Tensor& p : parameters) {
    if (p.grad().defined()) grads[p.grad().scalar_type()].push_back(p.grad());
  }
  return grads;
}

}  // namespace

at::Tensor grad_norm_part(const std::vector<at::Tensor>& parameters, double norm_type, c10::Device device) {
  const bool infinity = infinite(norm_type);
  at::Tensor part = at::zeros({}, at::TensorOptions(at::kDouble).device(device));
  for (const auto& [dtype, grads] : grads_by_dtype(parameters)) {
    const at::Tensor norms = at::stack(at::_foreach_norm(grads, norm_type)).to(at::kDouble);
    part = infinity ? at::maximum(part, norms.max()) : part + norms.pow(norm_type).sum();
  }
  return part;
}

at::Tensor grad_norm_of(const at::Tensor& part, double norm_type) {
  return infinite(norm_type) ? part : part.pow(1.0 / norm_type);
}

void scale_grads_to(const std::vector<at::Tensor>& parameters, double max_norm, const at::Tensor& norm) {
  const at::Tensor factor = (max_norm / (norm + 1e-6)).clamp_max(1.0);
  for (auto& [dtype, grads] : grads_by_dtype(parameters)) at::_foreach_mul_(grads, factor.to(dtype));
}

at::Tensor clip_local_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type,
                                c10::Device device) {
  const at::Tensor norm = grad_norm_of(grad_norm_part(parameters, norm_type, device), norm_type);
  scale_grads_to(parameters, max_norm, norm);
  return norm;
}

at::Tensor grad_norm_part(const strategy_context& context, const std::vector<named_tensor>& parameters,
                          double norm_type, c10::Device device) {
  std::vector<at::Tensor> cut, copied;
  for (const named_tensor& p : parameters) {
    const nn::tensor_split* split = context.tensor_split();
    (split != nullptr && !split->split_dim(p.name) ? copied : cut).push_back(p.tensor);
  }
  const at::Tensor cut_part = grad_norm_part(cut, norm_type, device);
  const at::Tensor copied_part = grad_norm_part(copied, norm_type, device);
  if (infinite(norm_type)) return at::maximum(cut_part, copied_part);
  return cut_part + copied_part / (context.tensor_split() != nullptr ? context.tensor_split()->size() : 1);
}

void add_up_over_tensor_group(const strategy_context& context, at::Tensor& part, double norm_type) {
  const nn::tensor_split* split = context.tensor_split();
  if (split == nullptr) return;
  at::Tensor flat = part.reshape({1});
  split->group().comm().all_reduce(flat, infinite(norm_type) ? reduce_op::max : reduce_op::sum).wait();
  part = flat.reshape({});
}

void require_no_strategy_state(std::string_view engine_name, const tensor_state& state) {
  if (state.empty()) return;
  throw_error<std::invalid_argument>(
      "{}() keeps no state of its own, but was given {} tensor(s) starting with '{}': the state was saved "
      "under another strategy",
      engine_name, state.size(), state.front().name);
}

}  // namespace loom::hooks

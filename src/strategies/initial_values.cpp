#include <loom/strategies/initial_values.hpp>

#include <loom/base/text.hpp>
#include <loom/io/weights.hpp>
#include <loom/lora/adapter.hpp>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <stdexcept>
#include <utility>

namespace loom {
namespace {

// `tensor` as rows × the rest (a 0-d tensor is one row).
at::Tensor by_rows(const at::Tensor& tensor) {
  const std::int64_t rows = tensor.dim() == 0 ? 1 : tensor.size(0);
  return tensor.reshape({rows, rows == 0 ? 0 : tensor.numel() / rows});
}

}  // namespace

initial_values::initial_values(std::shared_ptr<pretrained_checkpoint> checkpoint, bool checkpoint_read,
                               std::shared_ptr<nn::deferred_init> deferred)
    : checkpoint_(std::move(checkpoint)), checkpoint_read_(checkpoint_read), deferred_(std::move(deferred)) {}

pretrained_checkpoint* initial_values::unread_checkpoint() const noexcept {
  return checkpoint_read_ ? nullptr : checkpoint_.get();
}

void initial_values::fill(const std::vector<nn::row_request>& rows, const std::vector<named_tensor>& whole) {
  pretrained_checkpoint* checkpoint = unread_checkpoint();
  const auto from_checkpoint = [&](const std::string& name) {
    return checkpoint != nullptr && !lora_adapter::is_adapter_parameter(name) && checkpoint->holds(name);
  };
  const auto deferred = [&](const at::Tensor& tensor) { return deferred_ && deferred_->defers(tensor); };
  c10::NoGradGuard no_grad;
  std::vector<nn::row_request> replayed;
  for (const nn::row_request& request : rows) {
    at::Tensor destination = request.destination;
    if (from_checkpoint(request.name)) {
      destination.copy_(
          checkpoint->read_rows(request.name, request.first_row, request.row_count).reshape(destination.sizes()));
    } else if (deferred(request.tensor)) {
      replayed.push_back(request);
    } else if (!destination.is_same(request.tensor)) {
      destination.copy_(by_rows(request.tensor.detach())
                            .narrow(0, request.first_row, request.row_count)
                            .reshape(destination.sizes()));
    }
  }
  for (const named_tensor& item : whole) {
    const bool from_file = from_checkpoint(item.name);
    if (!from_file && !deferred(item.tensor)) continue;
    at::Tensor tensor = item.tensor;
    if (!nn::has_bytes(tensor)) tensor.set_data(at::empty(tensor.sizes(), tensor.options().requires_grad(false)));
    if (from_file) {
      tensor.copy_(checkpoint->read(item.name));
    } else {
      replayed.push_back({item.name, tensor, 0, tensor.dim() == 0 ? 1 : tensor.size(0), tensor});
    }
  }
  if (!replayed.empty()) deferred_->materialise(replayed);
  checkpoint_read_ = true;
}

std::vector<std::string> initial_values::finish() {
  std::vector<std::string> lines;
  if (deferred_) {
    lines.push_back(fmt::format(
        "constructed without the full replica: {} deferred, {} materialised on this rank ({} bytes kept)",
        counted(static_cast<std::int64_t>(deferred_->size()), "tensor"),
        counted(static_cast<std::int64_t>(deferred_->tensors_materialised()), "tensor"), deferred_->bytes_kept()));
  }
  if (checkpoint_) {
    lines.push_back(fmt::format("weights from '{}': {}, {} of their {} bytes read on this rank",
                                checkpoint_->path().string(),
                                counted(static_cast<std::int64_t>(checkpoint_->size()), "tensor"),
                                checkpoint_->bytes_read(), checkpoint_->total_bytes()));
  }
  checkpoint_.reset();
  deferred_.reset();
  return lines;
}

}  // namespace loom

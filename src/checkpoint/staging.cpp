#include <loom/checkpoint/staging.hpp>

#include <loom/runtime/host_reads.hpp>

#include <ATen/ops/empty.h>

namespace loom {

at::Tensor host_staging::stage(const at::Tensor& tensor) {
  const at::Tensor source = tensor.detach();
  const bool from_device = !source.is_cpu();
  if (from_device) device_ = source.device();
  if (next_ == buffers_.size()) buffers_.emplace_back();
  at::Tensor& buffer = buffers_[next_++];
  if (!buffer.defined() || buffer.sizes() != source.sizes() || buffer.scalar_type() != source.scalar_type() ||
      buffer.is_pinned() != from_device) {
    buffer = at::empty(source.sizes(), source.options().device(at::kCPU).pinned_memory(from_device));
  }
  buffer.copy_(source, /*non_blocking=*/from_device);
  return buffer;
}

void host_staging::finish(job_progress& progress) {
  if (device_) wait_for_device(progress, *device_);
}

std::vector<const void*> host_staging::addresses() const {
  std::vector<const void*> found;
  for (const at::Tensor& buffer : buffers_) found.push_back(buffer.const_data_ptr());
  return found;
}

}  // namespace loom

#include <loom/runtime/host_reads.hpp>

#include <ATen/ops/empty.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace loom {
namespace {

void synchronize(c10::Device device) { c10::impl::getDeviceGuardImpl(device.type())->getStream(device).synchronize(); }

}  // namespace

at::Tensor read_on_host(job_progress& progress, const at::Tensor& tensor) {
  const job_progress::host_read_scope reading(progress);
  return read_on_host_uncounted(tensor);
}

at::Tensor read_on_host_uncounted(const at::Tensor& tensor) {
  const at::Tensor source = tensor.detach();
  if (source.is_cpu()) return source;
  at::Tensor host = at::empty(source.sizes(), source.options().device(at::kCPU).pinned_memory(true));
  host.copy_(source, /*non_blocking=*/true);
  synchronize(source.device());
  return host;
}

void wait_for_device(job_progress& progress, c10::Device device) {
  if (device.is_cpu()) return;
  const job_progress::host_read_scope reading(progress);
  synchronize(device);
}

at::Tensor to_device(const at::Tensor& host, c10::Device device, at::ScalarType dtype) {
  if (!host.is_cpu()) {
    TORCH_CHECK(!device.is_cpu(), "loom::to_device: a tensor on ", host.device(),
                " moved to the host is a read of the device: read it through loom::read_on_host");
    return host.to(device, dtype);
  }
  if (device.is_cpu()) return host.to(dtype);
  // The pinned block stays the host allocator's until the copy that reads it is done.
  const at::Tensor pinned = host.is_pinned() ? host : host.pin_memory();
  // Cast on the device: a copy that casts on the way would cast into pageable host memory first.
  return pinned.to(device, /*non_blocking=*/true).to(dtype);
}

}  // namespace loom

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

}  // namespace loom

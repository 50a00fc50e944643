#pragma once
// The one way loom reads a tensor's values on the host, and moves host tensors to the device. On a
// GPU every read stops the host until the device has caught up: the host can no longer run ahead
// into the next kernels, and under NCCL, whose waits return at once, the read is where a rank blocks
// on a peer. So each read is counted by the part of the pass it falls in (job_progress::host_reads:
// a test holds the steps that are not logged to none) and marked as a wait on the last collective
// issued, which the hang check names. A copy to the device from pageable host memory stops the host
// as well; to_device stages it through pinned memory instead.
//
// Nothing else in src/ or include/loom/ calls .item(), .cpu() or .to(kCPU): the host-reads lint
// (tests/unit/host_reads_lint.py) holds it so.

#include <loom/runtime/progress.hpp>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

namespace loom {

// `tensor`'s values in host memory: the tensor itself when it is on the CPU, else a copy in pinned
// memory, made by one non-blocking copy and one wait for the device's current stream.
[[nodiscard]] at::Tensor read_on_host(job_progress& progress, const at::Tensor& tensor);

// The same outside any job's steps (a file written from the tensor, a check at setup): not counted.
[[nodiscard]] at::Tensor read_on_host_uncounted(const at::Tensor& tensor);

// Waits until `device`'s current stream has run what was queued on it (copies into host memory
// started without blocking), as one read, counted and marked as read_on_host's are. Nothing on the CPU.
void wait_for_device(job_progress& progress, c10::Device device);

// `host` (in host memory) on `device` as `dtype`, without making the host wait: a copy from pinned
// memory that the device makes when its stream reaches it, where a copy from pageable memory would
// stop the host until it is done. On the CPU, `host` itself (cast when asked); a tensor on a device
// already, moved to another device as Tensor::to moves it, and refused on its way to the host.
[[nodiscard]] at::Tensor to_device(const at::Tensor& host, c10::Device device, at::ScalarType dtype);

// The one value of a tensor in host memory (an agreement's, a Gloo collective's, the CPU's):
// reading it costs nothing. A device tensor is loom's bug here: read it through read_on_host.
template <class T>
[[nodiscard]] T host_value(const at::Tensor& tensor) {
  TORCH_INTERNAL_ASSERT(tensor.is_cpu(), "host_value of a tensor on ", tensor.device(),
                        ": read it through read_on_host, which counts it");
  return tensor.item<T>();
}

}  // namespace loom

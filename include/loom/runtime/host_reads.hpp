#pragma once
// The one way loom reads a tensor's values on the host. On a GPU every such read stops the host until
// the device has caught up: the host can no longer run ahead into the next kernels, and under NCCL,
// whose waits return at once, the read is where a rank blocks on a peer. So each read is counted by
// the part of the pass it falls in (job_progress::host_reads: a test holds forward and backward to
// none) and marked as a wait on the last collective issued, which the hang check names.

#include <loom/runtime/progress.hpp>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace loom {

// `tensor`'s values in host memory: the tensor itself when it is on the CPU, else a copy in pinned
// memory, made by one non-blocking copy and one wait for the device's current stream.
[[nodiscard]] at::Tensor read_on_host(job_progress& progress, const at::Tensor& tensor);

// Waits until `device`'s current stream has run what was queued on it (copies into host memory
// started without blocking), as one read, counted and marked as read_on_host's are. Nothing on the CPU.
void wait_for_device(job_progress& progress, c10::Device device);

}  // namespace loom

#pragma once
// The host buffers a save copies the state into: pinned when the state is on a device, so that each
// copy is one DMA started without blocking, and kept from one save to the next, which stages the same
// tensors in the same order, so that a run's saves allocate them once (as
// torch.distributed.checkpoint.async_save's staging does). A save allocates no device memory.

#include <loom/runtime/progress.hpp>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstddef>
#include <optional>
#include <vector>

namespace loom {

class host_staging {
 public:
  // A save starts from the first buffer again.
  void begin() noexcept {
    next_ = 0;
    device_.reset();
  }
  // The next buffer, holding `tensor`'s values once finish() returns: the last save's buffer at this
  // place when it has the same size and dtype, else a new one.
  [[nodiscard]] at::Tensor stage(const at::Tensor& tensor);
  // Waits once for the copies staged from a device: one host read (loom/runtime/host_reads.hpp).
  void finish(job_progress& progress);

  // The buffers' addresses, in staging order: what a test compares across saves.
  [[nodiscard]] std::vector<const void*> addresses() const;

 private:
  std::vector<at::Tensor> buffers_;
  std::size_t next_ = 0;
  std::optional<c10::Device> device_;  // where this save's copies come from, when not the CPU
};

}  // namespace loom

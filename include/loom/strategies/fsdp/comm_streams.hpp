#pragma once
// fsdp()'s streams (FSDP2's comm context). On a device with streams, the gathers' packing, the
// all-gathers, the reduce-scatters and hybrid sharding's all-reduces across replicas are issued from
// streams of their own. NCCL's stream follows the stream current when a collective is issued, so a
// collective issued from its own stream waits on the device for what it reads, not for every kernel
// the compute stream holds by then, and the packing kernels run beside the compute. The compute
// stream takes a result through pending_collective::wait() (ProcessGroupNCCL makes the current
// stream wait; the host goes on). On the CPU there are no streams: every role is the current stream,
// and the code around them is the same.

#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>

#include <optional>
#include <vector>

namespace loom::sharding {

enum class comm_role { gather_copy_in, gather, reduce_scatter, replicate };

class comm_streams {
 public:
  // While alive, a role's stream is current (on the CPU, nothing changes).
  class [[nodiscard]] scope {
   public:
    scope() = default;
    explicit scope(c10::Stream stream) : guard_(std::in_place, stream) {}

   private:
    std::optional<c10::StreamGuard> guard_;
  };

  comm_streams() = default;  // none: every role is the current stream
  // Streams of their own on a device that has them (a GPU, the gathers' at high priority, as FSDP2's,
  // so that a prefetch is not queued behind compute kernels); none on the CPU.
  explicit comm_streams(c10::Device device);

  // `role`'s stream made current, once it has waited for everything the stream current until now
  // has issued: what the work on it reads was written there.
  [[nodiscard]] scope enter(comm_role role) const;
  // `role`'s stream made current, once it has waited for what `before`'s stream has issued so far,
  // and nothing that the current stream issued since.
  [[nodiscard]] scope enter_after(comm_role role, comm_role before) const;
  // `role`'s stream made current, waiting for nothing: for work that a collective's wait orders.
  [[nodiscard]] scope on(comm_role role) const;
  // The current stream goes on, on the device, once `role`'s stream has done what it holds now: what
  // the current stream allocated and `role`'s stream read may then be handed out again.
  void wait_for(comm_role role) const;

 private:
  [[nodiscard]] const c10::Stream& stream(comm_role role) const { return streams_[static_cast<std::size_t>(role)]; }

  std::vector<c10::Stream> streams_;  // by comm_role; empty on the CPU
};

}  // namespace loom::sharding

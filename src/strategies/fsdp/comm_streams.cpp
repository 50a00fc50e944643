#include <loom/strategies/fsdp/comm_streams.hpp>

#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace loom::sharding {
namespace {

// `waiting` goes on, on the device, once `awaited` has done what it holds now; the host does not wait.
void order_after(const c10::Stream& waiting, const c10::Stream& awaited) {
  if (waiting == awaited) return;
  c10::Event event(awaited.device_type());
  event.record(awaited);
  event.block(waiting);
}

}  // namespace

comm_streams::comm_streams(c10::Device device) {
  if (device.is_cpu()) return;
  const c10::impl::VirtualGuardImpl guard(device.type());
  for (const comm_role role :
       {comm_role::gather_copy_in, comm_role::gather, comm_role::reduce_scatter, comm_role::replicate}) {
    const bool gathers = role == comm_role::gather_copy_in || role == comm_role::gather;
    streams_.push_back(guard.getStreamFromGlobalPool(device, /*isHighPriority=*/gathers));
  }
}

comm_streams::scope comm_streams::enter(comm_role role) const {
  if (streams_.empty()) return {};
  const c10::Stream& own = stream(role);
  order_after(own, c10::impl::VirtualGuardImpl(own.device_type()).getStream(own.device()));
  return scope(own);
}

comm_streams::scope comm_streams::enter_after(comm_role role, comm_role before) const {
  if (streams_.empty()) return {};
  order_after(stream(role), stream(before));
  return scope(stream(role));
}

comm_streams::scope comm_streams::on(comm_role role) const {
  if (streams_.empty()) return {};
  return scope(stream(role));
}

void comm_streams::wait_for(comm_role role) const {
  if (streams_.empty()) return;
  const c10::Stream& own = stream(role);
  order_after(c10::impl::VirtualGuardImpl(own.device_type()).getStream(own.device()), own);
}

}  // namespace loom::sharding

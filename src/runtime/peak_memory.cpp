#include <loom/runtime/peak_memory.hpp>

#include <ATen/DeviceAccelerator.h>

#include <sys/resource.h>

namespace loom {

namespace {

constexpr auto aggregate = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);

}  // namespace

void reset_peak_memory(c10::Device device) {
  if (device.is_cuda()) at::accelerator::resetPeakStats(device.index());
}

std::int64_t peak_memory_bytes(c10::Device device) {
  if (device.is_cuda()) return at::accelerator::getDeviceStats(device.index()).allocated_bytes[aggregate].peak;
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::int64_t>(usage.ru_maxrss) * 1024;  // Linux counts it in KiB
}

std::string_view peak_memory_kind(c10::Device device) noexcept {
  return device.is_cuda() ? "allocated to tensors on the device" : "resident";
}

}  // namespace loom

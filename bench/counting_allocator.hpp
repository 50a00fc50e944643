#pragma once
// LibTorch's CPU allocations, counted: the bytes handed out and not taken back, and their peak. Every
// live CPU tensor's storage, exactly, whatever malloc does with the pages (RSS counts those).
// Installed for a whole program, before its first tensor:
//
//   c10::SetCPUAllocator(&bench::counting_allocator::instance(), /*priority=*/100);
//
// The memory comes from c10::alloc_cpu, as LibTorch's own CPU allocator takes it, and each block's
// context is its data, so that raw_allocate and raw_deallocate work as with that allocator.

#include <c10/core/Allocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <unordered_map>

namespace bench {

class counting_allocator final : public c10::Allocator {
 public:
  // The one a program installs: freed blocks find it from their deleter, which has no context of its own.
  static counting_allocator& instance() {
    static counting_allocator allocator;
    return allocator;
  }

  c10::DataPtr allocate(std::size_t bytes) override {
    void* data = c10::alloc_cpu(bytes);
    if (data != nullptr) {
      const std::lock_guard<std::mutex> lock(mutex_);
      sizes_.emplace(data, bytes);
    }
    const std::int64_t now = live_ += static_cast<std::int64_t>(bytes);
    std::int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return {data, data, &release, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* destination, const void* source, std::size_t count) const override {
    std::memcpy(destination, source, count);
  }

  [[nodiscard]] std::int64_t live_bytes() const { return live_.load(); }
  [[nodiscard]] std::int64_t peak_bytes() const { return peak_.load(); }
  [[nodiscard]] double peak_mb() const { return static_cast<double>(peak_.load()) / (1024.0 * 1024.0); }
  // From now on, the peak counts from what is live now.
  void reset_peak() { peak_.store(live_.load()); }

 private:
  counting_allocator() = default;

  static void release(void* data) {
    if (data == nullptr) return;
    counting_allocator& self = instance();
    std::size_t bytes = 0;
    {
      const std::lock_guard<std::mutex> lock(self.mutex_);
      const auto found = self.sizes_.find(data);
      if (found != self.sizes_.end()) {
        bytes = found->second;
        self.sizes_.erase(found);
      }
    }
    self.live_ -= static_cast<std::int64_t>(bytes);
    c10::free_cpu(data);
  }

  std::mutex mutex_;
  std::unordered_map<void*, std::size_t> sizes_;
  std::atomic<std::int64_t> live_{0};
  std::atomic<std::int64_t> peak_{0};
};

}  // namespace bench

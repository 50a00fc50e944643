#pragma once
// LibTorch's CPU allocator wrapped, counting the bytes it has handed out and not taken back, and their
// peak: every live CPU tensor's storage, exactly, whatever malloc does with the pages (RSS counts
// those). Installed for a whole program with c10::SetCPUAllocator before the first tensor.

#include <c10/core/Allocator.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace bench {

class counting_allocator final : public c10::Allocator {
 public:
  explicit counting_allocator(c10::Allocator* inner) : inner_(inner) {}

  c10::DataPtr allocate(std::size_t bytes) override {
    auto* held = new allocation{inner_->allocate(bytes), bytes, this};
    const std::int64_t now = live_ += static_cast<std::int64_t>(bytes);
    std::int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return {held->data.get(), held, &release, held->data.device()};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* destination, const void* source, std::size_t count) const override {
    std::memcpy(destination, source, count);
  }

  [[nodiscard]] std::int64_t live_bytes() const { return live_.load(); }
  [[nodiscard]] std::int64_t peak_bytes() const { return peak_.load(); }
  [[nodiscard]] double peak_mb() const { return static_cast<double>(peak_.load()) / (1024.0 * 1024.0); }
  // From now on, the peak counts from what is live now.
  void reset_peak() { peak_.store(live_.load()); }

 private:
  struct allocation {
    c10::DataPtr data;
    std::size_t bytes;
    counting_allocator* owner;
  };
  static void release(void* context) {
    auto* held = static_cast<allocation*>(context);
    held->owner->live_ -= static_cast<std::int64_t>(held->bytes);
    delete held;
  }

  c10::Allocator* inner_;
  std::atomic<std::int64_t> live_{0};
  std::atomic<std::int64_t> peak_{0};
};

}  // namespace bench

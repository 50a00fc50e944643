#pragma once
// Making and checking identical replicas across ranks before the first step.

#include <ATen/core/Generator.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <mutex>

namespace loom {

class runtime;
namespace nn {
class deferred_init;
}

// Runs construction under a fork of the default CPU generator seeded with `seed`; the caller's
// generator state is restored on destruction (torch.random.fork_rng in Python).
class forked_rng {
 public:
  explicit forked_rng(std::uint64_t seed);
  ~forked_rng();
  forked_rng(const forked_rng&) = delete;
  forked_rng& operator=(const forked_rng&) = delete;

 private:
  at::Generator generator_;
  at::Tensor saved_state_;
};

// seeded(s): every rank built its replica on its own. One checksum per parameter and buffer (name,
// shape, dtype, bytes) is compared across ranks; on a difference every rank throws rank_mismatch
// naming the first differing tensor.
void verify_identical_replicas(const runtime& rt, torch::nn::Module& module, std::uint64_t seed);

// Without seeded: checks that the ranks built the same structure (names, shapes, dtypes), then
// copies rank 0's parameters and buffers to every rank; those constructed without their bytes
// (`deferred`) get rank 0's generator state to replay, so that their values are rank 0's too.
void broadcast_replicas(const runtime& rt, torch::nn::Module& module, nn::deferred_init* deferred = nullptr);

}  // namespace loom

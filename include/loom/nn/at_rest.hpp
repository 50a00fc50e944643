#pragma once
// A parameter that a sharding strategy keeps at rest holds no bytes between its unit's passes
// (fsdp(): each rank keeps only its shard). loom's layers check for it, so that a model called
// outside the strategy's hooks stops with a sentence that says what to do instead of ATen's
// "out of bounds for storage of size 0".

#include <ATen/core/Tensor.h>

#include <stdexcept>
#include <string_view>

namespace loom::nn {

class parameters_at_rest : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// Throws parameters_at_rest, naming `layer` ("loom::nn::Linear"), when `weight` has elements but
// its storage holds no bytes.
void require_bytes(const at::Tensor& weight, std::string_view layer);

}  // namespace loom::nn

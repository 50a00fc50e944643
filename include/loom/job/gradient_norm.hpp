#pragma once
// gradient_norm: what job.clip_grad_norm returns, the gradients' norm before clipping as a 0-d tensor
// on the job's device, an at::Tensor in every use. loom 0.1.0 returned a double, read on the host;
// so that a program written against it still compiles, the tensor converts to a double, deprecated:
// the conversion waits for the device, which the tensor spares every step that does not log the norm.
// The conversion goes in loom 0.3.0, and this class with it: clip_grad_norm will return an at::Tensor
// (docs/changes.md).

#include <loom/runtime/host_reads.hpp>
#include <loom/runtime/runtime.hpp>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>

#include <type_traits>
#include <utility>

namespace loom {

class gradient_norm : public at::Tensor {
 public:
  gradient_norm(at::Tensor norm, runtime rt) : at::Tensor(std::move(norm)), rt_(std::move(rt)) {}

  // 0.1.0's `double norm = job.clip_grad_norm(1.0);`. A read of the device on the host, counted as
  // loom's own are (loom/runtime/host_reads.hpp).
  [[deprecated(
      "job.clip_grad_norm returns the norm as an at::Tensor on the job's device since loom 0.2.0, and this "
      "conversion to double waits for the device: read it with at::Tensor::item<double>() where it is logged; the "
      "conversion goes in loom 0.3.0")]]
  operator double() const {  // NOLINT(google-explicit-constructor): 0.1.0's callers convert implicitly
    return host_value<double>(read_on_host(rt_.progress(), *this));
  }

  // at::Tensor's arithmetic and comparisons with a number: without them `norm > 1.0` would be
  // ambiguous between the tensor's comparison and double's, through the conversion above.
#define LOOM_GRADIENT_NORM_WITH_NUMBER(op)                                  \
  template <class Number>                                                   \
  requires std::is_arithmetic_v<Number>                                     \
  friend at::Tensor operator op(const gradient_norm& norm, Number number) { \
    return static_cast<const at::Tensor&>(norm) op number;                  \
  }                                                                         \
  template <class Number>                                                   \
  requires std::is_arithmetic_v<Number>                                     \
  friend at::Tensor operator op(Number number, const gradient_norm& norm) { \
    return number op static_cast<const at::Tensor&>(norm);                  \
  }
  LOOM_GRADIENT_NORM_WITH_NUMBER(+)
  LOOM_GRADIENT_NORM_WITH_NUMBER(-)
  LOOM_GRADIENT_NORM_WITH_NUMBER(*)
  LOOM_GRADIENT_NORM_WITH_NUMBER(/)
  LOOM_GRADIENT_NORM_WITH_NUMBER(%)
  LOOM_GRADIENT_NORM_WITH_NUMBER(<)
  LOOM_GRADIENT_NORM_WITH_NUMBER(<=)
  LOOM_GRADIENT_NORM_WITH_NUMBER(>)
  LOOM_GRADIENT_NORM_WITH_NUMBER(>=)
  LOOM_GRADIENT_NORM_WITH_NUMBER(==)
  LOOM_GRADIENT_NORM_WITH_NUMBER(!=)
#undef LOOM_GRADIENT_NORM_WITH_NUMBER

 private:
  runtime rt_;  // whose progress counts the conversion's read: a shared handle, valid as long as the norm
};

}  // namespace loom

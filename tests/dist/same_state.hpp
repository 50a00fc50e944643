#pragma once
// Two jobs' state_dicts compared name by name, the same names in the same order: within an absolute
// tolerance, or bit for bit; and how far one tensor is from another.

#include <loom/runtime/tensors.hpp>

#include <algorithm>

#include <ATen/ATen.h>

#include <catch2/catch_test_macros.hpp>

namespace loom::testing {

// How far `a` is from `b`, relative to b's largest magnitude: the measure the parity tests bound.
inline double difference(const at::Tensor& a, const at::Tensor& b) {
  const double scale = std::max(b.abs().max().item<double>(), 1e-12);
  return (a.to(at::kFloat) - b.to(at::kFloat)).abs().max().item<double>() / scale;
}

// `check(actual, expected)` on each pair, after the names.
template <class Reference, class Other, class Check>
void compare_states(Reference& reference, Other& other, Check check) {
  const tensor_state expected = reference.state_dict();
  const tensor_state actual = other.state_dict();
  REQUIRE(actual.size() == expected.size());
  for (std::size_t i = 0; i < actual.size(); ++i) {
    CAPTURE(actual[i].name);
    REQUIRE(actual[i].name == expected[i].name);
    check(actual[i].tensor, expected[i].tensor);
  }
}

template <class Reference, class Other>
void check_same_state(Reference& reference, Other& other, double tolerance) {
  compare_states(reference, other, [&](const at::Tensor& actual, const at::Tensor& expected) {
    CHECK(at::allclose(actual, expected, 0, tolerance));
  });
}

// The same dtypes and the same bits.
template <class Reference, class Other>
void check_bit_equal(Reference& reference, Other& other) {
  compare_states(reference, other, [](const at::Tensor& actual, const at::Tensor& expected) {
    REQUIRE(actual.scalar_type() == expected.scalar_type());
    CHECK(at::equal(actual, expected));
  });
}

}  // namespace loom::testing

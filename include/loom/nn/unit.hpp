#pragma once
// loom::nn::Unit<B>: marks a block as a unit of sharding (FSDP's "unit"): under fsdp() it is gathered
// for its own forward and backward and sharded at rest. LibTorch modules have no forward hooks, so
// the mark is in the model's type: hold the block as Unit<Block> and call it through that type.
//
//   blocks->push_back(std::make_shared<loom::nn::Unit<BlockImpl>>(d, heads));
//   x = blocks[i]->as<loom::nn::Unit<BlockImpl>>()->forward(x);
//
// Unit<B> is a B: it takes B's constructor arguments and registers nothing of its own (parameter
// names and seeded draws are B's). Under local() and ddp() it is transparent.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom::nn {

// What a sharding strategy does around a unit's forward.
class unit_hooks {
 public:
  virtual ~unit_hooks() = default;
  virtual void before_forward(std::size_t unit) = 0;
  // `outputs` are the unit's output tensors: the strategy hangs its pre-backward gather on them.
  virtual void after_forward(std::size_t unit, const std::vector<at::Tensor>& outputs) = 0;
};

// The part of every Unit<B> that does not depend on B: which strategy, if any, runs around it.
class unit_base {
 public:
  void attach(unit_hooks* hooks, std::size_t index) noexcept {
    hooks_ = hooks;
    index_ = index;
  }
  void detach() noexcept { hooks_ = nullptr; }

 protected:
  unit_base() = default;
  ~unit_base() = default;

  template <class Forward>
  decltype(auto) run(Forward&& forward) {
    if (!hooks_) return std::forward<Forward>(forward)();
    hooks_->before_forward(index_);
    decltype(auto) output = std::forward<Forward>(forward)();
    hooks_->after_forward(index_, tensors_of(output));
    return output;
  }

 private:
  static std::vector<at::Tensor> tensors_of(const at::Tensor& output) { return {output}; }
  template <class... T>
  static std::vector<at::Tensor> tensors_of(const std::tuple<T...>& outputs) {
    std::vector<at::Tensor> tensors;
    std::apply([&](const auto&... each) { (add_tensor(tensors, each), ...); }, outputs);
    return tensors;
  }
  template <class A, class B>
  static std::vector<at::Tensor> tensors_of(const std::pair<A, B>& outputs) {
    return tensors_of(std::tie(outputs.first, outputs.second));
  }
  template <class Other>
  static std::vector<at::Tensor> tensors_of(const Other&) {
    return {};  // no tensor to hang a hook on: the strategy keeps the unit gathered for backward
  }
  template <class T>
  static void add_tensor(std::vector<at::Tensor>& tensors, const T& value) {
    if constexpr (std::is_same_v<std::remove_cvref_t<T>, at::Tensor>) tensors.push_back(value);
  }

  unit_hooks* hooks_ = nullptr;
  std::size_t index_ = 0;
};

template <class B>
class Unit : public B, public unit_base {
 public:
  using B::B;

  template <class... Args>
  decltype(auto) forward(Args&&... args) {
    return run([&]() -> decltype(auto) { return B::forward(std::forward<Args>(args)...); });
  }
};

}  // namespace loom::nn

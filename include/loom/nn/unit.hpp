#pragma once
// loom::nn::Unit<B>: marks a block as a unit of sharding (FSDP's "unit"): under fsdp() it is gathered
// for its own forward and backward and sharded at rest. LibTorch modules have no forward hooks, so
// the mark is in the model's type: hold the block as Unit<Block> and call it through that type.
//
//   blocks->push_back(std::make_shared<loom::nn::Unit<BlockImpl>>(d, heads));
//   x = blocks[i]->as<loom::nn::Unit<BlockImpl>>()->forward(x);
//
// Unit<B> is a B: it takes B's constructor arguments and registers nothing of its own (parameter
// names and seeded draws are B's). Under local() and ddp() it is transparent, but for recompute(...):
// a unit chosen to recompute runs its forward keeping no activations and again in backward
// (loom/nn/recompute.hpp). A unit that recomputes takes tensors, std::optional tensors, plain
// values (numbers, enums) and constant inputs (a type with `using constant_input = void;`, whose
// tensors are never differentiated: a packed batch's documents; or an optional one) as its
// forward's arguments, and returns a tensor or a std::tuple of them.

#include <loom/nn/recompute.hpp>

#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>

#include <cstddef>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}

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
  void set_recompute(bool recompute) noexcept { recompute_ = recompute; }
  [[nodiscard]] bool recomputes() const noexcept { return recompute_; }

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
  bool recompute_ = false;
};

// Each loom::nn::Unit in `model` (not the model itself), in registration order, by its dotted name.
struct unit_module {
  std::string name;
  unit_base* module = nullptr;
};
[[nodiscard]] std::vector<unit_module> find_units(torch::nn::Module& model);

namespace detail {

template <class T>
inline constexpr bool is_tensor = std::is_same_v<std::remove_cvref_t<T>, at::Tensor>;
template <class T>
inline constexpr bool is_optional_tensor = std::is_same_v<std::remove_cvref_t<T>, std::optional<at::Tensor>>;

// A value whose tensors are not differentiated, which a recomputation copies and passes again as it
// is: a type that says so with `using constant_input = void;`, or an optional one.
template <class T>
concept marked_constant = requires {
  typename T::constant_input;
};
template <class T>
inline constexpr bool is_constant_input = marked_constant<T>;
template <class T>
inline constexpr bool is_constant_input<std::optional<T>> = marked_constant<T>;

// An argument a recomputation can pass again: a tensor (its detached copy), or a copy of a value.
template <class T>
inline constexpr bool replayable_argument =
    is_tensor<T> || is_optional_tensor<T> || std::is_arithmetic_v<std::remove_cvref_t<T>> ||
    std::is_enum_v<std::remove_cvref_t<T>> || is_constant_input<std::remove_cvref_t<T>>;

template <class R>
inline constexpr bool replayable_result = is_tensor<R> && !std::is_reference_v<R>;
template <class... T>
inline constexpr bool replayable_result<std::tuple<T...>> = (is_tensor<T> && ...);

inline void add_input(std::vector<at::Tensor>& inputs, const at::Tensor& value) {
  if (value.defined()) inputs.push_back(value);
}
inline void add_input(std::vector<at::Tensor>& inputs, const std::optional<at::Tensor>& value) {
  if (value && value->defined()) inputs.push_back(*value);
}
template <class T>
void add_input(std::vector<at::Tensor>&, const T&) {}

inline void put_input(at::Tensor& value, const std::vector<at::Tensor>& inputs, std::size_t& next) {
  if (value.defined()) value = inputs[next++];
}
inline void put_input(std::optional<at::Tensor>& value, const std::vector<at::Tensor>& inputs, std::size_t& next) {
  if (value && value->defined()) value = inputs[next++];
}
template <class T>
void put_input(T&, const std::vector<at::Tensor>&, std::size_t&) {}

inline std::vector<at::Tensor> result_tensors(at::Tensor output) { return {std::move(output)}; }
template <class... T>
std::vector<at::Tensor> result_tensors(std::tuple<T...> outputs) {
  return std::apply([](auto&... each) { return std::vector<at::Tensor>{std::move(each)...}; }, outputs);
}

template <class R>
R result_from(std::vector<at::Tensor>& outputs) {
  if constexpr (is_tensor<R>) {
    return std::move(outputs.front());
  } else {
    return [&]<std::size_t... I>(std::index_sequence<I...>) { return R(std::move(outputs[I])...); }
    (std::make_index_sequence<std::tuple_size_v<R>>());
  }
}

// The unit's trainable parameters, which a recomputed backward differentiates.
[[nodiscard]] std::vector<at::Tensor> trainable_parameters(torch::nn::Module& unit);
[[noreturn]] void fail_not_replayable(const std::type_info& block);

}  // namespace detail

template <class B>
class Unit : public B, public unit_base {
 public:
  using B::B;

  template <class... Args>
  decltype(auto) forward(Args&&... args) {
    return run([&]() -> decltype(auto) {
      using result = decltype(B::forward(std::forward<Args>(args)...));
      if (recomputes() && at::GradMode::is_enabled()) {
        if constexpr (detail::replayable_result<result> && (detail::replayable_argument<Args> && ...)) {
          return recomputed<result>(args...);
        } else {
          detail::fail_not_replayable(typeid(B));
        }
      }
      return B::forward(std::forward<Args>(args)...);
    });
  }

 private:
  template <class Result, class... Args>
  Result recomputed(const Args&... args) {
    std::vector<at::Tensor> inputs;
    (detail::add_input(inputs, args), ...);
    replay_forward replay =
        [this, arguments = std::tuple<std::remove_cvref_t<Args>...>(args...)](const std::vector<at::Tensor>& tensors) {
          auto call = arguments;
          std::size_t next = 0;
          std::apply([&](auto&... each) { (detail::put_input(each, tensors, next), ...); }, call);
          return detail::result_tensors(std::apply([this](auto&... each) { return B::forward(each...); }, call));
        };
    std::vector<at::Tensor> outputs = run_recomputed(replay, inputs, detail::trainable_parameters(*this));
    return detail::result_from<Result>(outputs);
  }
};

}  // namespace loom::nn

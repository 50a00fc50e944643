#pragma once
// A user-written strategy: after each backward, every trainable gradient is averaged across ranks,
// one all-reduce per parameter. Plain and slow next to ddp()'s overlapped buckets, but complete: it
// declares its collectives in setup, so build() checks them across ranks like any other schedule.
//
//   auto plan = loom::model<Net>() | loom::seeded(1) | loom::strategy(examples::average_every_step{});

#include <loom/loom.hpp>

#include <string>
#include <string_view>

namespace examples {

struct average_every_step {
  static constexpr std::string_view name = "average_every_step";

  [[nodiscard]] std::string options() const { return {}; }

  void setup(loom::strategy_context& context) {
    for (const auto& p : context.trainable()) {
      context.schedule().add({loom::collective_op::all_reduce,
                              loom::step_phase::backward,
                              {{p.name, p.tensor.sizes().vec(), p.tensor.scalar_type()}}});
    }
  }

  void before_forward(loom::strategy_context&) {}

  void after_backward(loom::strategy_context& context) {
    if (!context.sync_gradients()) return;
    for (const auto& p : context.trainable()) {
      if (!p.tensor.grad().defined()) p.tensor.mutable_grad() = torch::zeros_like(p.tensor);
      context.rt().comm().all_reduce(p.tensor.mutable_grad(), loom::reduce_op::mean).wait();
    }
  }
};

}  // namespace examples

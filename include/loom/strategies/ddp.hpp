#pragma once
// ddp(options): c10d's Reducer, the engine under PyTorch's DistributedDataParallel, driven from C++.
// Gradients are bucketed in reverse registration order (the order backward produces them) and each
// bucket's all-reduce starts as soon as its last gradient is ready, overlapping backward.

#include <loom/dsl/strategies.hpp>
#include <loom/strategy_context.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace c10d {
class Reducer;
}

namespace loom {

class ddp_engine {
 public:
  static constexpr std::string_view name = "ddp";

  explicit ddp_engine(const ddp_options& settings);
  ddp_engine(const ddp_engine&) = delete;
  ddp_engine(ddp_engine&&) noexcept;
  ddp_engine& operator=(ddp_engine&&) noexcept;
  ~ddp_engine();

  [[nodiscard]] std::string options() const { return ddp_stage(settings_).options(); }
  void setup(strategy_context& context);
  void before_forward(strategy_context& context);
  void before_backward(strategy_context& context, const at::Tensor& loss);
  void after_backward(strategy_context& context);

  // Parameter indices (into context.trainable()) of each bucket, in reduction order.
  [[nodiscard]] const std::vector<std::vector<std::size_t>>& buckets() const noexcept { return buckets_; }

 private:
  struct state;
  ddp_options settings_;
  std::vector<std::vector<std::size_t>> buckets_;
  std::unique_ptr<state> state_;
};

}  // namespace loom

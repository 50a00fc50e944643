#pragma once
// ddp(options): c10d's Reducer, the engine under PyTorch's DistributedDataParallel, driven from C++.
// Gradients are bucketed in reverse registration order (about the order backward produces them) and
// each bucket's all-reduce starts as soon as its last gradient is ready, overlapping backward. As
// DDP does, the buckets are rebuilt once, before the second synchronised step, in the order the
// first one's gradients became ready (rank 0's); the schedule then takes the new buckets and is
// checked across ranks again. (Not with find_unused_parameters, as DDP.)

#include <loom/dsl/strategies.hpp>
#include <loom/strategies/strategy_context.hpp>

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace loom {

class ddp_engine {
 public:
  static constexpr std::string_view name = "ddp";

  explicit ddp_engine(const ddp_options& settings);
  // Moved, never copied: the gradient hooks point at its state.
  ddp_engine(ddp_engine&&) noexcept = default;
  ddp_engine& operator=(ddp_engine&&) noexcept = default;

  void setup(strategy_context& context);
  void before_forward(strategy_context& context);
  void before_backward(strategy_context& context, const at::Tensor& loss);
  void after_backward(strategy_context& context);

  // Parameter indices (into context.trainable()) of each bucket, in reduction order (after the
  // first synchronised step, in the rebuilt order).
  [[nodiscard]] const std::vector<std::vector<std::size_t>>& buckets() const noexcept { return buckets_; }

 private:
  // The steps of setup, in order.
  void add_schedule_entries(strategy_context& context) const;
  [[nodiscard]] schedule_entry bucket_entry(const strategy_context& context, std::size_t bucket) const;
  void start_reducer(strategy_context& context, std::int64_t bucket_cap_bytes);
  void watch_gradients(strategy_context& context);
  void note_buckets(strategy_context& context, std::string_view when) const;
  // Before a synchronised forward: the Reducer's one rebuild, once it has recorded the ready order.
  void rebuild_buckets(strategy_context& context);
  // After a synchronised backward: the gradients this rank produced against what the options allow.
  void check_static_graph(strategy_context& context);
  void check_every_gradient_produced(strategy_context& context) const;
  // gradient_as_bucket_view: each gradient the bucket's bytes, not an autograd view of them.
  void hand_out_bucket_bytes(strategy_context& context) const;

  struct state;
  ddp_options settings_;
  std::vector<std::vector<std::size_t>> buckets_;
  std::shared_ptr<state> state_;  // shared_ptr: its deleter is made where state is complete
};

inline ddp_engine make_engine(const ddp_stage& stage) { return ddp_engine(stage.settings()); }

}  // namespace loom

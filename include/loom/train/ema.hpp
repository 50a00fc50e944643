#pragma once
// An exponential moving average of the trained weights, as FastVideo's EMA keeps one of a DiT's
// (docs/training.md, "EMA"):
//
//   loom::ema averages(job, {.decay = 0.999, .start_step = 100});
//   for (std::int64_t step = 1; step <= steps; ++step) {
//     ...; opt.step(); opt.zero_grad();
//     averages.update(step);                      // on the device: no host read
//   }
//   { auto in_place = averages.swapped_in();      // the averages are the weights while it lives
//     job.save_adapter("adapter-ema"); }
//
// One fp32 average per trainable parameter, laid out as the optimizer sees it: under fsdp() this
// rank's shard of each (no rank holds a whole copy), under LoRA the adapters alone. As FastVideo's
// EMA callback: until start_step the average follows the weights (a copy), at the first step from
// start_step on it starts from them, and each step from then blends them in:
// average ← decay · average + (1 − decay) · weight. A checkpointer saves it beside the weights
// (loom/checkpoint/checkpoint.hpp), resharded like them, and a resumed run continues it bit for bit.

#include <loom/dsl/options.hpp>
#include <loom/runtime/tensors.hpp>
#include <loom/train/lr_schedule.hpp>  // option_problem

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace loom {

// FastVideo's (its EMA callback's decay and start_iter; ema_decay and ema_start_step in its older trainer).
struct ema_options {
  double decay = 0.9999;
  std::int64_t start_step = 0;

  // What a run file's "ema" object sets.
  static constexpr auto fields() {
    return std::tuple{option_field{"decay", &ema_options::decay}, option_field{"start_step", &ema_options::start_step}};
  }

  // The first field out of range, if any ("decay", "is 1.5; give a decay in [0, 1)").
  [[nodiscard]] std::optional<option_problem> problem() const;
  [[nodiscard]] std::string describe() const;
};

class ema {
 public:
  // The averages of `parameters` (what the optimizer steps), named `names`, starting as copies of
  // them. Throws std::invalid_argument naming an option out of range, or names that do not match.
  ema(std::vector<at::Tensor> parameters, std::vector<std::string> names, const ema_options& options);
  template <class Job>
  ema(const Job& job, const ema_options& options) : ema(job.trainable_parameters(), job.trainable_names(), options) {}

  [[nodiscard]] const ema_options& options() const noexcept { return options_; }

  // After the optimizer's step `step` (the first is 1): a copy of the weights up to start_step (and at
  // step 1), the blend from start_step on. Queued on the weights' device; reads nothing on the host.
  void update(std::int64_t step);

  // This rank's averages, fp32, by parameter name (what a checkpoint saves), and back: each must
  // be there with its shape, else std::invalid_argument names it.
  [[nodiscard]] tensor_state state() const;
  void load(const tensor_state& state);

  // The averages copied into the weights while it lives (for validation, or to save them), the
  // weights put back, bit for bit, when it ends. Outside any pass, between steps.
  class [[nodiscard]] weights_swap {
   public:
    explicit weights_swap(const ema& averages);
    ~weights_swap();
    weights_swap(const weights_swap&) = delete;
    weights_swap& operator=(const weights_swap&) = delete;

   private:
    const ema& averages_;
    std::vector<at::Tensor> kept_;  // the weights, as they were
  };
  [[nodiscard]] weights_swap swapped_in() const { return weights_swap(*this); }

 private:
  ema_options options_;
  std::vector<at::Tensor> parameters_;
  std::vector<std::string> names_;
  std::vector<at::Tensor> averages_;
};

}  // namespace loom

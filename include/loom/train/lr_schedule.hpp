#pragma once
// The learning rate as a pure function of the step: a linear warmup, a stable stretch at the peak,
// then a decay to a floor over the last steps (torchtitan's warmup-stable-decay), so a resumed run
// sets the rate a run never stopped would have had.
//
//   lr_schedule lr{.peak = 3e-4, .warmup_steps = 100, .decay_steps = 200, .total_steps = 1000,
//                  .decay = decay_shape::cosine, .floor = 0.1};
//   apply_learning_rate(optimizer, lr.at(step));
//
// The lengths may be fractions of the run instead, which scale with it (a short trial run keeps
// the shape of the long one): .warmup_ratio = 0.1 (transformers' warmup_ratio, rounded up) and
// .decay_ratio = 0.2 (torchtitan's decay_ratio, rounded down), so that the two always fit; a
// product whole but for floating point (0.1 · 300) is whole (30, where Python's ceil gives 31).

#include <loom/dsl/options.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>

namespace torch::optim {
class Optimizer;
}

namespace loom {

enum class decay_shape { linear, cosine };

// An option out of range: its name ("peak", "steps") and what is wrong with it, in words that
// follow the name ("is 0; give at least 1").
struct option_problem {
  std::string option;
  std::string problem;
};

[[nodiscard]] std::string_view to_string(decay_shape shape) noexcept;

struct lr_schedule {
  double peak = 1e-3;
  // Steps 1 … warmup_steps rise linearly to the peak: step s has peak · s / (warmup_steps + 1).
  std::int64_t warmup_steps = 0;
  // The last decay_steps of total_steps fall from the peak to floor · peak, which the last step
  // reaches; 0 keeps the peak to the end.
  std::int64_t decay_steps = 0;
  std::int64_t total_steps = 0;
  // In place of warmup_steps: ceil(warmup_ratio · total_steps) steps of warmup.
  std::optional<double> warmup_ratio{};
  // In place of decay_steps: floor(decay_ratio · total_steps) steps of decay.
  std::optional<double> decay_ratio{};
  decay_shape decay = decay_shape::linear;
  double floor = 0.0;  // a fraction of the peak, in [0, 1]

  // What a run file's "train.lr" sets (total_steps follows "train.steps").
  static constexpr auto fields() {
    return std::tuple{option_field{"peak", &lr_schedule::peak},
                      option_field{"warmup_steps", &lr_schedule::warmup_steps},
                      option_field{"decay_steps", &lr_schedule::decay_steps},
                      option_field{"warmup_ratio", &lr_schedule::warmup_ratio},
                      option_field{"decay_ratio", &lr_schedule::decay_ratio},
                      option_field{"decay", &lr_schedule::decay},
                      option_field{"floor", &lr_schedule::floor}};
  }

  // The rate of optimizer step `step` (counted from 1). Throws std::invalid_argument naming the
  // field that is out of range (check() says it before the first step).
  [[nodiscard]] double at(std::int64_t step) const;
  void check() const;
  // The warmup's and the decay's steps, from the ratios where they are given.
  [[nodiscard]] std::int64_t warmup_length() const;
  [[nodiscard]] std::int64_t decay_length() const;
  // The first field out of range, if any: what check() throws for.
  [[nodiscard]] std::optional<option_problem> problem() const;
};

// Sets the learning rate of every parameter group.
void apply_learning_rate(torch::optim::Optimizer& optimizer, double lr);

}  // namespace loom

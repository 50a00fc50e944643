// sequence_parallel(k): each sequence split across a group of k consecutive ranks (DeepSpeed-Ulysses,
// FastVideo's sp_size, torchtitan's context parallelism by another route). The world becomes k
// sequence-parallel ranks × world / k data-parallel ones; the ranks of one group read the same batch
// and each keeps its 1/k of every sequence, and an all-to-all around attention trades the split
// sequence for split heads. docs/sequence_parallel.md.
#pragma once

#include <loom/dsl/data_parallel.hpp>
#include <loom/dsl/describe.hpp>
#include <loom/dsl/diagnostics.hpp>
#include <loom/dsl/options.hpp>
#include <loom/dsl/pipe.hpp>
#include <loom/dsl/stage_kind.hpp>

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>

namespace loom {

struct sequence_parallel_options {
  // The ranks one sequence is split across (FastVideo's sp_size); 1 splits nothing.
  std::size_t size = 1;

  static constexpr auto fields() { return std::tuple{option_field{"size", &sequence_parallel_options::size}}; }
};

class sequence_parallel_stage : public detail::pipeable {
 public:
  using options_type = sequence_parallel_options;
  static constexpr stage_kind kind = stage_kind::sequence_parallel;
  static constexpr std::string_view name = "sequence_parallel";

  // For values known only at run time: the checks of sequence_parallel(...), throwing plan_error.
  static constexpr sequence_parallel_stage checked(const sequence_parallel_options& settings) {
    detail::enforce(settings.size == 0 ? violation::r20_size_zero : violation::none);
    return sequence_parallel_stage(settings);
  }

  [[nodiscard]] constexpr const sequence_parallel_options& settings() const noexcept { return settings_; }
  [[nodiscard]] std::string options() const { return options_text(settings_); }
  [[nodiscard]] std::string describe() const { return detail::call_text(name, options()); }

 private:
  constexpr explicit sequence_parallel_stage(const sequence_parallel_options& settings) : settings_(settings) {}

  sequence_parallel_options settings_;
};

// Which batches a rank reads under sequence_parallel(k) alone: data-parallel rank r / k of world / k.
// A plan's place, whichever stages split its world, is data_parallel(plan, rank, world_size).
constexpr data_parallel_place data_parallel(const std::optional<sequence_parallel_stage>& stage, int rank,
                                            int world_size) noexcept {
  return detail::data_parallel_in_groups(stage ? stage->settings().size : 1, rank, world_size);
}

// Constant arguments, checked while compiling: sequence_parallel(2) splits each sequence over two
// ranks. With a run-time value use sequence_parallel_stage::checked.
consteval sequence_parallel_stage sequence_parallel(std::size_t size) {
  return sequence_parallel_stage::checked({.size = size});
}

}  // namespace loom

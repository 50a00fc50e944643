// The built-in strategies: local(), ddp(options), fsdp(options). The runtime maps each to its engine.
#pragma once

#include <loom/dsl/describe.hpp>
#include <loom/dsl/options.hpp>
#include <loom/dsl/pipe.hpp>
#include <loom/dsl/stage_kind.hpp>

#include <cstddef>
#include <string>
#include <string_view>
#include <tuple>

namespace loom {

// One process, nothing to synchronise; the strategy of a plan that names none.
struct local_stage : detail::pipeable {
  static constexpr stage_kind kind = stage_kind::local;
  static constexpr std::string_view name = "local";

  [[nodiscard]] std::string options() const { return {}; }
  [[nodiscard]] std::string describe() const { return detail::call_text(name, options()); }
};

constexpr local_stage local() noexcept { return {}; }

// Named and defaulted as PyTorch's DistributedDataParallel names them (broadcast_buffers excepted:
// loom builds bit-identical replicas, so there is nothing to broadcast by default).
struct ddp_options {
  std::size_t bucket_cap_mb = 25;
  bool broadcast_buffers = false;
  bool find_unused_parameters = false;
  bool gradient_as_bucket_view = false;
  bool static_graph = false;

  static constexpr auto fields() {
    return std::tuple{option_field{"bucket_cap_mb", &ddp_options::bucket_cap_mb},
                      option_field{"broadcast_buffers", &ddp_options::broadcast_buffers},
                      option_field{"find_unused_parameters", &ddp_options::find_unused_parameters},
                      option_field{"gradient_as_bucket_view", &ddp_options::gradient_as_bucket_view},
                      option_field{"static_graph", &ddp_options::static_graph}};
  }
};

// A built-in strategy with options: ddp(), fsdp().
template <stage_kind Kind, described_options Options>
class configured_strategy_stage : public detail::pipeable {
 public:
  using options_type = Options;
  static constexpr stage_kind kind = Kind;
  static constexpr std::string_view name = name_of(Kind);

  constexpr explicit configured_strategy_stage(const Options& settings) noexcept : settings_(settings) {}

  [[nodiscard]] constexpr const Options& settings() const noexcept { return settings_; }
  [[nodiscard]] std::string options() const { return options_text(settings_); }
  [[nodiscard]] std::string describe() const { return detail::call_text(name, options()); }

 private:
  Options settings_;
};

using ddp_stage = configured_strategy_stage<stage_kind::ddp, ddp_options>;

// ddp() or ddp({.bucket_cap_mb = 50, .static_graph = true})
constexpr ddp_stage ddp(const ddp_options& settings = {}) noexcept { return ddp_stage(settings); }

struct fsdp_options {
  bool reshard_after_forward = true;  // free the gathered parameters after forward, gather again for backward
  std::size_t bucket_cap_mb = 25;     // the replicated adapters' gradient all-reduce, as ddp()'s buckets

  static constexpr auto fields() {
    return std::tuple{option_field{"reshard_after_forward", &fsdp_options::reshard_after_forward},
                      option_field{"bucket_cap_mb", &fsdp_options::bucket_cap_mb}};
  }
};

using fsdp_stage = configured_strategy_stage<stage_kind::fsdp, fsdp_options>;

// fsdp() or fsdp({.reshard_after_forward = false})
constexpr fsdp_stage fsdp(const fsdp_options& settings = {}) noexcept { return fsdp_stage(settings); }

}  // namespace loom

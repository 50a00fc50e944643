// The built-in strategies: local(), ddp(options), fsdp(options). The runtime maps each to its engine.
#pragma once

#include <loom/dsl/describe.hpp>
#include <loom/dsl/options.hpp>
#include <loom/dsl/pipe.hpp>
#include <loom/dsl/stage_kind.hpp>

#include <cstddef>
#include <cstdint>
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
  // describe() without the layout options (option_role): how a checkpoint records the stage.
  [[nodiscard]] std::string describe_state() const {
    return detail::call_text(name, options_text(settings_, /*state_only=*/true));
  }

 private:
  Options settings_;
};

using ddp_stage = configured_strategy_stage<stage_kind::ddp, ddp_options>;

// ddp() or ddp({.bucket_cap_mb = 50, .static_graph = true})
constexpr ddp_stage ddp(const ddp_options& settings = {}) noexcept { return ddp_stage(settings); }

struct fsdp_options {
  // shard_group_size: how many consecutive ranks one parameter is sharded across; the groups
  // replicate each other, their reduced gradients averaged across them (hybrid sharding, FSDP2's 2-D
  // mesh (replicate, shard), torchtitan's dp_replicate × dp_shard).
  static constexpr std::int64_t every_rank = 0;  // one group of every rank: plain FSDP
  static constexpr std::int64_t per_node = -1;   // the ranks of a node: LOCAL_WORLD_SIZE

  bool reshard_after_forward = true;  // free the gathered parameters after forward, gather again for backward
  std::size_t bucket_cap_mb = 25;     // the replicated adapters' gradient all-reduce, as ddp()'s buckets
  std::int64_t shard_group_size = every_rank;
  // Inside job.no_sync() (every micro-batch but the last of loom::train's accumulation): false
  // reduce-scatters each micro-batch's gradients into the shards, so that a rank never holds more than
  // a unit or two of whole gradients, and leaves only the all-reduces across replicas for the last
  // (FSDP2's default, set_requires_all_reduce(False)); true keeps the whole model's gradients unsharded
  // until the last micro-batch, one reduce-scatter a step instead of one a micro-batch, for jobs whose
  // bandwidth is scarcer than memory (FSDP2's set_requires_gradient_sync(False)).
  bool accumulate_unsharded = false;
  // On a GPU: each rank's shards, their gradients and the optimizer's state live in pinned host
  // memory, each unit's shards are copied to the device for its all-gather, each reduced gradient
  // back to the host, and the optimizer steps on the host (FSDP2's CPUOffloadPolicy(pin_memory=True),
  // FSDP1's CPUOffload(offload_params=True)). A bool rather than a policy: FSDP2's offload_policy has
  // one choice besides none, and the one setting of that, pin_memory, loom always takes (a copy from
  // pageable memory would stop the host at every gather). A layout option: the same values, held
  // elsewhere, so a checkpoint saved with it resumes without it. Refused on a CPU device.
  bool offload = false;

  static constexpr auto fields() {
    return std::tuple{option_field{"reshard_after_forward", &fsdp_options::reshard_after_forward},
                      option_field{"bucket_cap_mb", &fsdp_options::bucket_cap_mb},
                      option_field{"shard_group_size", &fsdp_options::shard_group_size, option_role::layout},
                      option_field{"accumulate_unsharded", &fsdp_options::accumulate_unsharded, option_role::layout},
                      option_field{"offload", &fsdp_options::offload, option_role::layout}};
  }
};

using fsdp_stage = configured_strategy_stage<stage_kind::fsdp, fsdp_options>;

// fsdp(), fsdp({.reshard_after_forward = false}), fsdp({.shard_group_size = fsdp_options::per_node}),
// fsdp({.offload = true})
constexpr fsdp_stage fsdp(const fsdp_options& settings = {}) noexcept { return fsdp_stage(settings); }

}  // namespace loom

#pragma once
// What a strategy sees of the job it runs (the definition behind the DSL's forward declaration):
// the ranks it runs over, the job's world, the built module, its trainable parameters in registration order, the plan's
// mixed-precision policy, and the schedule it fills in during setup.

#include <loom/precision/precision.hpp>
#include <loom/runtime/runtime.hpp>
#include <loom/runtime/tensors.hpp>
#include <loom/schedule/schedule.hpp>
#include <loom/strategies/initial_values.hpp>

#include <torch/nn/module.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom::nn {
class tensor_split;
}

namespace loom {

class strategy_context {
 public:
  // `rt`: the ranks the strategy runs over; `world`: the job's, when they are fewer (tensor_parallel).
  strategy_context(runtime rt, std::shared_ptr<torch::nn::Module> module, std::optional<precision_policy> precision,
                   std::optional<runtime> world = std::nullopt);

  // The ranks the strategy runs over, which hold the same parameters: the job's world, or under
  // tensor_parallel(k) this rank's data-parallel group (every k-th rank), whose rank and world size
  // are the group's.
  [[nodiscard]] const runtime& rt() const noexcept { return runtime_; }
  // Every rank of the job: what the job itself agrees on, writes once and fails with.
  [[nodiscard]] const runtime& world() const noexcept { return world_ ? *world_ : runtime_; }
  [[nodiscard]] torch::nn::Module& module() noexcept { return *module_; }
  [[nodiscard]] const torch::nn::Module& module() const noexcept { return *module_; }
  [[nodiscard]] const std::vector<named_tensor>& trainable() const noexcept { return trainable_; }
  // The plan's mixed_precision(...), if any: an engine that casts parameters (fsdp) reads it in
  // setup; for the others the job runs the forward under autocast.
  [[nodiscard]] const std::optional<precision_policy>& precision() const noexcept { return precision_; }

  // Under tensor_parallel(k): the plan's split, which cut some parameters across this rank's tensor
  // group, the others whole on each of its ranks (a gradient norm counts those once); none otherwise.
  [[nodiscard]] const nn::tensor_split* tensor_split() const noexcept { return tensor_split_.get(); }
  void split_by(std::shared_ptr<nn::tensor_split> split) noexcept { tensor_split_ = std::move(split); }

  [[nodiscard]] collective_schedule& schedule() noexcept { return schedule_; }
  [[nodiscard]] const collective_schedule& schedule() const noexcept { return schedule_; }

  // False inside job.no_sync(): gradients accumulate locally, nothing is communicated.
  [[nodiscard]] bool sync_gradients() const noexcept { return sync_gradients_; }
  void set_sync_gradients(bool sync) noexcept { sync_gradients_ = sync; }

  // Throws std::invalid_argument naming `strategy` when the job spans ranks without a process group.
  void require_process_group(std::string_view strategy) const;

  // Where the parameters' first values come from. A replica strategy finds them in place. A sharding
  // engine's setup fills what each rank keeps from it (fsdp: its shards' rows); an engine that
  // leaves pretrained(...)'s checkpoint unread gets it copied in whole, through with_full_parameters.
  // A model is constructed without its bytes only for an engine that declares
  // materialises_parameters: its setup must fill every parameter.
  [[nodiscard]] loom::initial_values& initial_values() noexcept { return initial_values_; }

  // Lines for job.describe(): what the strategy decided (buckets, shards).
  void note(std::string line) { notes_.push_back(std::move(line)); }
  [[nodiscard]] const std::vector<std::string>& notes() const noexcept { return notes_; }

  // Tells the other ranks why this one is about to fail, then throws job_failure("loom: " + message):
  // a rank blocked in a collective with this one reports the message instead of a bare
  // "connection closed" (loom/runtime/failures.hpp).
  [[noreturn]] void fail(const std::string& message) const;

 private:
  runtime runtime_;
  std::optional<runtime> world_;
  std::shared_ptr<torch::nn::Module> module_;
  std::vector<named_tensor> trainable_;
  std::optional<precision_policy> precision_;
  std::shared_ptr<nn::tensor_split> tensor_split_;
  collective_schedule schedule_;
  std::vector<std::string> notes_;
  loom::initial_values initial_values_;
  bool sync_gradients_ = true;
};

}  // namespace loom

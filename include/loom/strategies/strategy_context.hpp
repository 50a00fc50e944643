#pragma once
// What a strategy sees of the job it runs (the definition behind the DSL's forward declaration):
// the runtime, the built module, its trainable parameters in registration order, the plan's
// mixed-precision policy, and the schedule it fills in during setup.

#include <loom/precision/precision.hpp>
#include <loom/runtime/runtime.hpp>
#include <loom/runtime/tensors.hpp>
#include <loom/schedule/schedule.hpp>

#include <torch/nn/module.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

class pretrained_checkpoint;

class strategy_context {
 public:
  strategy_context(runtime rt, std::shared_ptr<torch::nn::Module> module, std::optional<precision_policy> precision);

  [[nodiscard]] const runtime& rt() const noexcept { return runtime_; }
  [[nodiscard]] torch::nn::Module& module() noexcept { return *module_; }
  [[nodiscard]] const torch::nn::Module& module() const noexcept { return *module_; }
  [[nodiscard]] const std::vector<named_tensor>& trainable() const noexcept { return trainable_; }
  // The plan's mixed_precision(...), if any: an engine that casts parameters (fsdp) reads it in
  // setup; for the others the job runs the forward under autocast.
  [[nodiscard]] const std::optional<precision_policy>& precision() const noexcept { return precision_; }

  [[nodiscard]] collective_schedule& schedule() noexcept { return schedule_; }
  [[nodiscard]] const collective_schedule& schedule() const noexcept { return schedule_; }

  // False inside job.no_sync(): gradients accumulate locally, nothing is communicated.
  [[nodiscard]] bool sync_gradients() const noexcept { return sync_gradients_; }
  void set_sync_gradients(bool sync) noexcept { sync_gradients_ = sync; }

  // Throws std::invalid_argument naming `strategy` when the job spans ranks without a process group.
  void require_process_group(std::string_view strategy) const;

  // The plan's pretrained(...), opened and checked against the module, if any. Under a strategy that
  // shards parameters it is read after setup: the engine's setup may read what this rank keeps into
  // its shards (fsdp reads its shards' rows) and say so; whatever it leaves, the job copies in whole.
  [[nodiscard]] pretrained_checkpoint* pretrained() const noexcept { return pretrained_.get(); }
  void set_pretrained(std::shared_ptr<pretrained_checkpoint> checkpoint, bool read) {
    pretrained_ = std::move(checkpoint);
    pretrained_read_ = read;
  }
  [[nodiscard]] bool pretrained_read() const noexcept { return pretrained_read_; }
  void mark_pretrained_read() noexcept { pretrained_read_ = true; }

  // Lines for job.describe(): what the strategy decided (buckets, shards).
  void note(std::string line) { notes_.push_back(std::move(line)); }
  [[nodiscard]] const std::vector<std::string>& notes() const noexcept { return notes_; }

  // Tells the other ranks why this one is about to fail, then throws job_failure("loom: " + message):
  // a rank blocked in a collective with this one reports the message instead of a bare
  // "connection closed" (loom/runtime/failures.hpp).
  [[noreturn]] void fail(const std::string& message) const;

 private:
  runtime runtime_;
  std::shared_ptr<torch::nn::Module> module_;
  std::vector<named_tensor> trainable_;
  std::optional<precision_policy> precision_;
  collective_schedule schedule_;
  std::vector<std::string> notes_;
  std::shared_ptr<pretrained_checkpoint> pretrained_;
  bool pretrained_read_ = false;
  bool sync_gradients_ = true;
};

}  // namespace loom

#pragma once
// Where a sharding engine's setup takes the values of what each rank keeps: the plan's
// pretrained(...) checkpoint (only the rows kept), the records of a model constructed without its
// bytes (loom/nn/deferred_init.hpp, replayed), or the module's own tensors. It is filled once, in
// setup; a job whose engine leaves the checkpoint unread copies it in whole after.

#include <loom/nn/deferred_init.hpp>
#include <loom/runtime/tensors.hpp>

#include <memory>
#include <string>
#include <vector>

namespace loom {

class pretrained_checkpoint;

class initial_values {
 public:
  initial_values() = default;
  // `checkpoint_read`: build() copied the checkpoint in already (a replica strategy).
  initial_values(std::shared_ptr<pretrained_checkpoint> checkpoint, bool checkpoint_read,
                 std::shared_ptr<nn::deferred_init> deferred);

  // pretrained(...)'s checkpoint, opened and checked against the module, while nothing took it in.
  [[nodiscard]] pretrained_checkpoint* unread_checkpoint() const noexcept;
  [[nodiscard]] pretrained_checkpoint* checkpoint() const noexcept { return checkpoint_.get(); }
  [[nodiscard]] const nn::deferred_init* deferred() const noexcept { return deferred_.get(); }

  // Writes each request's rows, and gives each of `whole` (first its bytes, if it has none) all of its
  // values: from the checkpoint when it holds the tensor (never LoRA's adapters), else from the tensor's
  // deferred record, else, for rows, from the tensor itself. Once.
  void fill(const std::vector<nn::row_request>& rows, const std::vector<named_tensor>& whole);
  // The checkpoint copied in by other means (the job, with the engine's with_full_parameters).
  void mark_checkpoint_read() noexcept { checkpoint_read_ = true; }

  // Lines for job.describe(): what this rank materialised and read. Closes the checkpoint's files.
  [[nodiscard]] std::vector<std::string> finish();

 private:
  std::shared_ptr<pretrained_checkpoint> checkpoint_;
  bool checkpoint_read_ = false;
  std::shared_ptr<nn::deferred_init> deferred_;
};

}  // namespace loom

#pragma once
// Construction without the full replica. Under a deferred_init::scope, loom::nn's layers, loom::models
// and LoRA's adapters create their parameters with address space but no memory, and record how they
// would have initialised them. A sharding engine then gives each rank only what it keeps: it replays
// the records in construction order, one tensor at a time, on the generator state the construction
// started from, so that every rank's rows equal, bit for bit, those a full construction would have
// given it (torchdistx's deferred_init and FSDP2's meta-device construction, for LibTorch, which has
// neither a meta default device nor to_empty). docs/strategies.md, "Building without a full replica".

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/core/TensorOptions.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace loom::nn {

// How a parameter gets its values, applied to a contiguous CPU tensor of its construction's shape
// and dtype, with gradients off: it writes every element (a tensor initialised twice keeps the
// second's values; the first's draws still count).
struct initializer {
  std::function<void(at::Tensor&)> fill;
  bool draws = true;  // takes numbers from the default CPU generator
};

// A new parameter's tensor of `sizes` (`options`' dtype, else the default): with uninitialised
// memory, or, under a scope on this thread, with address space only.
[[nodiscard]] at::Tensor empty(at::IntArrayRef sizes, at::TensorOptions options = {});
// Applies `init` to `tensor` now, or records it when `tensor` is one the scope on this thread
// deferred: a layer's own initialisation, and a constructor's of its layers' weights after them.
void initialise(const at::Tensor& tensor, initializer init);

// Whether `tensor`'s storage holds all of its bytes: false for a parameter constructed without them
// (once the construction is accepted) and for an fsdp() parameter at rest.
[[nodiscard]] bool has_bytes(const at::Tensor& tensor) noexcept;
// Gives `tensor` (the same tensor: every handle to it sees the change) a storage without bytes, of
// `type` on `device`: its shape and autograd metadata stay.
void drop_bytes(const at::Tensor& tensor, at::ScalarType type, c10::Device device);
// The module's parameters and buffers on `device`: moved, or, those without bytes, given none there.
void to_device(torch::nn::Module& module, c10::Device device);

// Rows [first_row, first_row + row_count) of dim 0 of `tensor` (a 0-d tensor is one row), to be
// written into `destination`, which holds that many elements in any layout, dtype and device.
struct row_request {
  std::string name;
  at::Tensor tensor;
  std::int64_t first_row = 0;
  std::int64_t row_count = 0;
  at::Tensor destination;
};

class deferred_init {
 public:
  // While alive, loom's layers constructed on this thread defer their parameters into `records`, from
  // the default CPU generator's current state. One scope at a time a thread.
  class scope {
   public:
    explicit scope(deferred_init& records);
    ~scope();
    scope(const scope&) = delete;
    scope& operator=(const scope&) = delete;

   private:
    deferred_init* records_;
    deferred_init* outer_;
  };

  // After the construction under the scope: whether it can stand. It cannot when something drew from
  // the generator (a plain torch::nn layer initialising itself) or wrote a deferred parameter other
  // than through initialise: then the sentence names the layers that drew, or the parameter, for a
  // construction whole. Otherwise the deferred parameters are left without bytes.
  [[nodiscard]] std::optional<std::string> accept(const torch::nn::Module& root);
  // Puts the default generator back where the scope found it, to construct again, whole, from the
  // same stream (without seeded(...); a seeded construction forks its own).
  void rewind_generator() const;

  // A tensor of `sizes` in `type`, without bytes, made after the construction, whose values `init`
  // gives without drawing: a build step's parameter that takes its values from elsewhere (a quantized
  // weight's parts, from the checkpoint's weight). It is materialised as the construction's records
  // are, after them.
  [[nodiscard]] at::Tensor add(at::IntArrayRef sizes, at::ScalarType type, initializer init);

  [[nodiscard]] std::size_t size() const noexcept { return records_.size(); }
  [[nodiscard]] bool defers(const at::Tensor& tensor) const noexcept;
  // The generator state the records replay from: the construction's, or, to give every rank rank 0's
  // values (no seeded(...)), rank 0's.
  [[nodiscard]] const at::Tensor& start_state() const noexcept { return start_state_; }
  void replay_from(at::Tensor state) { start_state_ = std::move(state); }
  // Without seeded(...) a full construction leaves the default generator past its draws; so does
  // materialise, on a rank whose generator started where the replay starts.
  void set_advances_generator(bool advances) noexcept { advances_generator_ = advances; }

  // Writes each request's rows (every request of a deferred tensor), replaying the initialisations
  // in the order the construction made them, each on a tensor of its own, whole, one at a time, and
  // only as far as the last one a requested tensor needs. The caller's generator state is restored
  // after (or advanced, as above). What this rank materialised is counted for describe().
  void materialise(const std::vector<row_request>& requests);
  [[nodiscard]] std::size_t tensors_materialised() const noexcept { return materialised_; }
  [[nodiscard]] std::uint64_t bytes_kept() const noexcept { return bytes_kept_; }

 private:
  friend at::Tensor empty(at::IntArrayRef sizes, at::TensorOptions options);
  friend void initialise(const at::Tensor& tensor, initializer init);

  struct record {
    at::Tensor tensor;  // the module's, whose dtype and device may change before it is materialised
    std::vector<std::int64_t> sizes;
    at::ScalarType built_dtype = at::kFloat;
    std::optional<std::size_t> last_init;  // its last in inits_; none: zero, as nothing drew for it
  };
  struct init_event {
    std::size_t record;
    initializer init;
  };
  [[nodiscard]] record* find(const at::Tensor& tensor) noexcept;

  std::vector<record> records_;
  std::vector<init_event> inits_;  // in the order the construction made them
  at::Tensor start_state_;
  at::Tensor own_start_state_;  // the generator where the scope found it
  at::Tensor end_state_;        // and where the scope left it
  bool advances_generator_ = false;
  std::size_t materialised_ = 0;
  std::uint64_t bytes_kept_ = 0;
};

}  // namespace loom::nn

#pragma once
// The collectives that loom's strategies issue, over one c10d backend (Gloo or NCCL).
// Every call is asynchronous: it returns a handle to wait on, so communication overlaps compute.

#include <loom/runtime/progress.hpp>

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace c10d {
class Backend;
class Work;
struct ReduceOp;
}  // namespace c10d

namespace loom {

enum class reduce_op { sum, mean, max };

// An issued collective. wait() blocks until it is done (or the backend's timeout passes, which
// throws), then runs its completion step, e.g. copying a padded result into the caller's tensor.
// The wait is marked in the rank's progress, for the hang check.
// What the hang check learns of a collective: its number in this rank's order of issue over its
// group, what it is ("all_reduce Float[1]") and the group.
struct collective_label {
  job_progress* progress = nullptr;  // told of the wait, when set
  std::int64_t number = 0;
  std::string what;
  collective_group group;
  bool host_waits = false;  // the backend's wait returns once the collective is done (not NCCL's)
};

// c10d's Work stays behind this class (defined where it is complete), out of every recipe's headers.
class [[nodiscard]] pending_collective {
 public:
  pending_collective();  // nothing to wait for
  explicit pending_collective(c10::intrusive_ptr<c10d::Work> work, std::function<void()> then = {},
                              collective_label label = {});
  ~pending_collective();
  pending_collective(pending_collective&&) noexcept;
  pending_collective& operator=(pending_collective&&) noexcept;

  void wait();
  [[nodiscard]] bool is_completed() const;
  // This collective, then `next` once it is done (after its own completion step).
  [[nodiscard]] pending_collective and_then(std::function<void()> next) &&;

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::function<void()> then_;
  collective_label label_;
};

class collectives {
 public:
  // Without a backend (one rank, no process group) every collective is the identity.
  // `stage_through_host`: the backend takes CPU tensors only (Gloo for ranks sharing a GPU), so a
  // CUDA tensor is copied to the host, reduced there and copied back. `progress`, when given, is
  // told of every wait; `group`: the ranks the backend joins, for the hang check (the world's by
  // default; `rank` and `world_size` are then this rank's place in the group and its size).
  collectives(c10::intrusive_ptr<c10d::Backend> backend, int rank, int world_size, bool stage_through_host = false,
              job_progress* progress = nullptr, collective_group group = {});
  ~collectives();
  collectives(const collectives&) = delete;
  collectives& operator=(const collectives&) = delete;

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int world_size() const noexcept { return world_size_; }

  // Whether the backend orders its collectives on the device (NCCL), so that waiting on one makes
  // the device wait and the host goes on.
  [[nodiscard]] bool device_ordered() const noexcept { return device_ordered_; }

  // In place. mean is c10d's AVG where the backend has it (NCCL, in one kernel, as FSDP2 reduces);
  // elsewhere a sum divided by the world size once it is there: dividing first would round every
  // rank's part before the sum.
  pending_collective all_reduce(at::Tensor& tensor, reduce_op op = reduce_op::sum);
  pending_collective broadcast(at::Tensor& tensor, int root = 0);

  // The shard size for a flat tensor of `numel` elements: ceil(numel / world), so that the last
  // shard is padded.
  [[nodiscard]] std::int64_t shard_numel(std::int64_t numel) const noexcept;

  // Each rank's shard (shard_numel(flat.numel()) elements) concatenated into `flat`; the padding
  // past flat.numel() is dropped.
  pending_collective all_gather(const at::Tensor& shard, at::Tensor& flat);

  // `flat` reduced across ranks, this rank's slice of it written into `shard`; `flat` is padded
  // to world × shard elements as needed.
  pending_collective reduce_scatter(const at::Tensor& flat, at::Tensor& shard, reduce_op op = reduce_op::sum);

  // Each rank's `input` split into world equal blocks along dim 0, block j sent to rank j; `output`
  // (input's shape) receives rank i's block for this rank as its block i.
  pending_collective all_to_all(const at::Tensor& input, at::Tensor& output);

  pending_collective barrier();

  // Reduce-scatter as an all-reduce and a local slice: for backends without a native one, and
  // for tests that compare the two paths.
  void use_emulated_reduce_scatter(bool emulate) noexcept { emulate_reduce_scatter_ = emulate; }

 private:
  pending_collective emulated_reduce_scatter(const at::Tensor& padded, at::Tensor& shard);
  // What finishes a mean once the sum is in `sum`; nothing for a sum, or a mean the backend averages.
  [[nodiscard]] std::function<void()> divided_after(const at::Tensor& sum, reduce_op op) const;
  // The backend's reduction for `op`.
  [[nodiscard]] c10d::ReduceOp backend_op(reduce_op op) const;
  // The one place a collective starts: `start` (the backend's call, returning its work) issued now as
  // this rank's next collective, an `op` of `tensor`, told to the rank's progress, unfinished there
  // until its work is complete. The failpoint collective.issue holds it up (LOOM_FAILPOINT_SLEEP_S: a
  // rank slow to issue it) or skips it (LOOM_FAILPOINT_SKIP: a rank that never issues it).
  template <class Start>
  pending_collective issue(std::string_view op, const at::Tensor& tensor, Start start, std::function<void()> then = {});
  [[nodiscard]] bool staged(const at::Tensor& tensor) const noexcept { return stage_through_host_ && tensor.is_cuda(); }
  // A staged tensor's values on the host (loom/runtime/host_reads.hpp).
  [[nodiscard]] at::Tensor read_staged(const at::Tensor& tensor) const;
  // shard_numel(numel), or std::invalid_argument when `shard` does not have that many elements.
  std::int64_t checked_shard_size(std::string_view what, std::int64_t numel, const at::Tensor& shard) const;

  c10::intrusive_ptr<c10d::Backend> backend_;
  int rank_;
  int world_size_;
  bool stage_through_host_;
  bool device_ordered_ = false;
  bool emulate_reduce_scatter_ = false;
  job_progress* progress_;
  collective_group group_;
  std::int64_t issued_ = 0;
};

}  // namespace loom

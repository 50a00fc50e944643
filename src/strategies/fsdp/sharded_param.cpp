#include <loom/strategies/fsdp/sharded_param.hpp>

#include <loom/base/text.hpp>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <stdexcept>
#include <utility>
#include <vector>

namespace loom::sharding {
namespace {

// The pieces of a parameter's rows ([rows, row_numel]) and of its rank-major padded layout
// (by_rank: [N, s, row_numel]) that hold the same rows: the ranks whose s rows all exist, then the
// one rank whose rows stop early. Copying one side into the other is then at most two copies.
std::vector<std::pair<at::Tensor, at::Tensor>> matching_rows(const at::Tensor& rows, const at::Tensor& by_rank) {
  std::vector<std::pair<at::Tensor, at::Tensor>> pieces;
  const std::int64_t count = rows.size(0);
  const std::int64_t per_rank = by_rank.size(1);
  if (count == 0 || per_rank == 0) return pieces;
  const std::int64_t whole_ranks = count / per_rank;
  if (whole_ranks > 0) {
    pieces.emplace_back(rows.narrow(0, 0, whole_ranks * per_rank).view({whole_ranks, per_rank, rows.size(1)}),
                        by_rank.narrow(0, 0, whole_ranks));
  }
  const std::int64_t rest = count - whole_ranks * per_rank;
  if (rest > 0)
    pieces.emplace_back(rows.narrow(0, whole_ranks * per_rank, rest), by_rank[whole_ranks].narrow(0, 0, rest));
  return pieces;
}

}  // namespace

sharded_param::sharded_param(std::string name, at::Tensor parameter, int ranks, std::optional<at::ScalarType> compute,
                             bool offload)
    : name_(std::move(name)), full_(std::move(parameter)), offloaded_(offload) {
  rows_ = full_.dim() == 0 ? 1 : full_.size(0);
  row_numel_ = rows_ == 0 ? 0 : full_.numel() / rows_;
  shard_rows_ = (rows_ + ranks - 1) / ranks;
  ranks_ = ranks;
  trainable_ = full_.requires_grad();
  const at::TensorOptions options = full_.options().requires_grad(false);
  shard_ = offload ? at::zeros({shard_numel()}, options.device(at::kCPU).pinned_memory(true))
                   : at::zeros({shard_numel()}, options);
  shard_.requires_grad_(trainable_);
  compute_dtype_ = compute.value_or(full_.scalar_type());
}

at::Tensor sharded_param::full_rows() const { return full_.variable_data().view({rows_, row_numel_}); }

bool sharded_param::allocated() const noexcept { return full_.storage().nbytes() >= full_.nbytes(); }

// As FSDP2's free_storage / alloc_storage: the storage object, and so every view and autograd handle
// of the parameter, stays; only its bytes come and go. An empty parameter has no bytes either way.
void sharded_param::free_storage() const {
  if (full_.nbytes() == 0) return;
  TORCH_INTERNAL_ASSERT(allocated(), "fsdp(): '", name_, "' freed while at rest");
  c10::StorageImpl& storage = *full_.storage().unsafeGetStorageImpl();
  storage.set_data_ptr_noswap(c10::DataPtr(nullptr, storage.device()));
  storage.set_nbytes(0);
}

void sharded_param::alloc_storage() const {
  if (full_.nbytes() == 0) return;
  c10::StorageImpl& storage = *full_.storage().unsafeGetStorageImpl();
  TORCH_INTERNAL_ASSERT(storage.nbytes() == 0, "fsdp(): '", name_, "' given bytes while whole");
  const std::size_t padded = static_cast<std::size_t>(ranks_ * shard_numel()) * full_.itemsize();
  storage.set_data_ptr_noswap(storage.allocator()->allocate(padded));
  storage.set_nbytes(padded);
}

at::Tensor sharded_param::gathered_rows() const {
  TORCH_INTERNAL_ASSERT(full_.storage_offset() == 0, "fsdp(): '", name_, "' does not start its storage");
  return full_.variable_data().as_strided({ranks_, shard_numel()}, {shard_numel(), 1}, 0);
}

at::Tensor sharded_param::whole_from(const at::Tensor& by_rank) const {
  at::Tensor whole = at::empty(full_.sizes(), shard_.options().device(full_.device()).requires_grad(false));
  const at::Tensor blocks = by_rank.view({by_rank.size(0), shard_rows_, row_numel_});
  for (const auto& [rows, padded] : matching_rows(whole.view({rows_, row_numel_}), blocks)) rows.copy_(padded);
  return whole;
}

at::Tensor sharded_param::take_grad() {
  const at::Tensor& grad = full_.grad();
  // Both when earlier backwards stashed some (a parameter used in an earlier micro-batch, this one, or both).
  at::Tensor total = !stashed_grad_.defined() ? grad : grad.defined() ? stashed_grad_.add_(grad) : stashed_grad_;
  full_.mutable_grad().reset();
  stashed_grad_.reset();
  return total.defined() ? total.reshape({rows_, row_numel_}) : total;
}

void sharded_param::stash_grad(at::ScalarType reduce) {
  const at::Tensor& grad = full_.grad();
  if (!grad.defined() || grad.scalar_type() == reduce) return;
  stashed_grad_ = stashed_grad_.defined() ? stashed_grad_.add_(grad) : grad.to(reduce);
  full_.mutable_grad().reset();
}

void sharded_param::accumulate_grad(const at::Tensor& reduced) const {
  at::Tensor& grad = shard_.mutable_grad();
  if (offloaded_) {
    // Cast on the device, so that the copy out is a plain one into pinned memory, which does not block.
    at::Tensor landing = at::empty({shard_numel()}, shard_.options().requires_grad(false).pinned_memory(true));
    landing.copy_(reduced.to(shard_.scalar_type()), /*non_blocking=*/true);
    TORCH_INTERNAL_ASSERT(!landing_grad_.defined(), "fsdp(): '", name_, "' copied out twice before it settled");
    (grad.defined() ? landing_grad_ : grad) = std::move(landing);
    return;
  }
  if (grad.defined()) {
    grad.add_(reduced);
  } else if (reduced.scalar_type() == shard_.scalar_type()) {
    grad = reduced.detach();
  } else {
    grad = reduced.to(shard_.scalar_type());
  }
}

void sharded_param::settle_grad() const {
  if (!landing_grad_.defined()) return;
  shard_.mutable_grad().add_(landing_grad_);
  landing_grad_.reset();
}

void sharded_param::hold_whole(const at::Tensor& whole) const { at::Tensor(full_).set_data(whole); }

void sharded_param::release_whole(int rank) const {
  reshard_values(rank);
  release_full();
}

// The same parameter (every handle to it sees the change), its storage now the compute dtype's, empty.
void sharded_param::release_full() const { nn::drop_bytes(full_, compute_dtype_, full_.device()); }

sharded_param::row_range sharded_param::rows_of(int rank) const noexcept {
  const std::int64_t first = std::min(rows_, rank * shard_rows_);
  return {first, std::min(rows_, first + shard_rows_) - first};
}

void sharded_param::reshard_values(int rank) const {
  const at::Tensor mine = shard_.detach().view({shard_rows_, row_numel_});
  const auto [first, count] = rows_of(rank);
  if (count > 0) mine.narrow(0, 0, count).copy_(full_rows().narrow(0, first, count));
}

std::optional<nn::row_request> sharded_param::rows_request(int rank) const {
  const auto [first, count] = rows_of(rank);
  if (count == 0) return std::nullopt;
  return nn::row_request{name_, full_, first, count,
                         shard_.detach().view({shard_rows_, row_numel_}).narrow(0, 0, count)};
}

at::Tensor sharded_param::rows_from_shards(const std::vector<at::Tensor>& shards, int rank) const {
  std::vector<at::Tensor> blocks;
  for (const at::Tensor& shard : shards) blocks.push_back(shard.reshape({-1, row_numel_}));
  const at::Tensor all_rows = at::cat(blocks);
  if (all_rows.size(0) < rows_) {
    throw_error<std::invalid_argument>("fsdp(): the shards of '{}' hold {} rows, fewer than its {}", name_,
                                       all_rows.size(0), rows_);
  }
  at::Tensor mine = at::zeros({shard_rows_, row_numel_}, shard_.options().requires_grad(false));
  const auto [first, count] = rows_of(rank);
  if (count > 0) mine.narrow(0, 0, count).copy_(all_rows.narrow(0, first, count));
  return mine.view(-1);
}

}  // namespace loom::sharding

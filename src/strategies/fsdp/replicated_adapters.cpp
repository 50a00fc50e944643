#include <loom/strategies/fsdp/replicated_adapters.hpp>

#include <loom/runtime/failpoints.hpp>
#include <loom/strategies/buckets.hpp>

#include <algorithm>
#include <numeric>
#include <utility>

namespace loom::sharding {

replicated_adapters::replicated_adapters(std::vector<named_tensor> adapters, std::int64_t bucket_cap_bytes,
                                         std::optional<at::ScalarType> reduce)
    : adapters_(std::move(adapters)), reduce_(reduce) {
  std::sort(adapters_.begin(), adapters_.end(),
            [](const named_tensor& a, const named_tensor& b) { return a.name < b.name; });
  std::vector<std::size_t> by_name(adapters_.size());
  std::iota(by_name.begin(), by_name.end(), std::size_t{0});
  for (std::vector<std::size_t>& members :
       assign_buckets(adapters_, by_name, [bucket_cap_bytes](std::size_t) { return bucket_cap_bytes; })) {
    std::vector<std::int64_t> sizes;
    for (std::size_t i : members) sizes.push_back(adapters_[i].tensor.numel());
    buckets_.push_back({std::move(members), flagged_gradients(std::move(sizes))});
  }
}

at::ScalarType replicated_adapters::reduce_dtype(std::size_t bucket) const {
  return reduce_.value_or(adapters_[buckets_[bucket].members.front()].tensor.scalar_type());
}

schedule_entry replicated_adapters::bucket_entry(std::size_t bucket) const {
  schedule_entry entry{collective_op::all_reduce, step_phase::backward, {}, "world"};
  for (std::size_t i : buckets_[bucket].members) {
    tensor_spec spec = adapters_[i].spec();
    spec.dtype = reduce_dtype(bucket);
    entry.tensors.push_back(std::move(spec));
  }
  return entry;
}

void replicated_adapters::start_all_reduce(std::size_t bucket, collectives& comm) {
  const std::vector<std::size_t>& members = buckets_[bucket].members;
  at::Tensor packed =
      buckets_[bucket]
          .layout
          .pack(1, adapters_[members.front()].tensor.options().dtype(reduce_dtype(bucket)).requires_grad(false),
                [&](std::size_t k, const at::Tensor& slot) {
                  const at::Tensor& grad = adapters_[members[k]].tensor.grad();
                  if (!grad.defined()) return false;
                  slot.view(-1).copy_(grad.reshape(-1));
                  return true;
                })
          .view(-1);
  pending_collective work = comm.all_reduce(packed, reduce_op::mean);
  failpoint("step.backward");  // mid backward, with the replicated adapters' all-reduce under way
  in_flight_.push_back({bucket, std::move(packed), std::move(work)});
}

void replicated_adapters::finish_all_reduces() {
  for (reduction& r : in_flight_) {
    r.work.wait();
    const std::vector<std::size_t>& members = buckets_[r.bucket].members;
    buckets_[r.bucket].layout.unpack(r.packed, [&](std::size_t k, const at::Tensor& mean) {
      const at::Tensor& tensor = adapters_[members[k]].tensor;
      tensor.mutable_grad() = mean.view_as(tensor).to(tensor.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
    });
  }
  in_flight_.clear();
}

}  // namespace loom::sharding

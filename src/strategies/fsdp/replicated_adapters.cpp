#include <loom/strategies/fsdp/replicated_adapters.hpp>

#include <loom/runtime/failpoints.hpp>
#include <loom/strategies/buckets.hpp>

#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>
#include <string_view>
#include <utility>

namespace loom::sharding {

replicated_adapters::replicated_adapters(std::vector<named_tensor> adapters, std::int64_t bucket_cap_bytes,
                                         std::optional<at::ScalarType> reduce,
                                         const std::vector<nn::branch_module>& branches)
    : adapters_(std::move(adapters)), reduce_(reduce) {
  const auto branch = [&](const named_tensor& t) { return nn::branch_of(branches, t.name); };
  std::sort(adapters_.begin(), adapters_.end(), [&](const named_tensor& a, const named_tensor& b) {
    return std::pair(branch(a), std::string_view(a.name)) < std::pair(branch(b), std::string_view(b.name));
  });
  for (std::size_t first = 0; first < adapters_.size();) {
    const std::size_t in = branch(adapters_[first]);
    std::size_t last = first;
    while (last < adapters_.size() && branch(adapters_[last]) == in) ++last;
    std::vector<std::size_t> by_name(last - first);
    std::iota(by_name.begin(), by_name.end(), first);
    for (std::vector<std::size_t>& members :
         assign_buckets(adapters_, by_name, [bucket_cap_bytes](std::size_t) { return bucket_cap_bytes; })) {
      buckets_.push_back({std::move(members), in, in < branches.size() ? branches[in].name : std::string()});
    }
    first = last;
  }
}

at::ScalarType replicated_adapters::reduce_dtype(std::size_t bucket) const {
  return reduce_.value_or(adapters_[buckets_[bucket].members.front()].tensor.scalar_type());
}

schedule_entry replicated_adapters::bucket_entry(std::size_t bucket) const {
  schedule_entry entry{collective_op::all_reduce, step_phase::backward, {}, "world"};
  entry.branch = buckets_[bucket].branch_name;
  for (std::size_t i : buckets_[bucket].members) {
    tensor_spec spec = adapters_[i].spec();
    spec.dtype = reduce_dtype(bucket);
    entry.tensors.push_back(std::move(spec));
  }
  return entry;
}

void replicated_adapters::start_all_reduce(std::size_t bucket, collectives& comm) {
  const std::vector<std::size_t>& members = buckets_[bucket].members;
  const at::ScalarType dtype = reduce_dtype(bucket);
  std::vector<at::Tensor> grads;
  for (std::size_t i : members) {
    const at::Tensor& tensor = adapters_[i].tensor;
    const at::Tensor& grad = tensor.grad();
    grads.push_back(grad.defined() ? grad.reshape(-1).to(dtype)
                                   : at::zeros({tensor.numel()}, tensor.options().dtype(dtype).requires_grad(false)));
  }
  at::Tensor packed = at::cat(grads);
  pending_collective work = comm.all_reduce(packed, reduce_op::mean);
  failpoint("step.backward");  // mid backward, with the replicated adapters' all-reduce under way
  in_flight_.push_back({bucket, std::move(packed), std::move(work)});
}

void replicated_adapters::finish_all_reduces() {
  for (reduction& r : in_flight_) {
    r.work.wait();
    std::int64_t offset = 0;
    for (std::size_t i : buckets_[r.bucket].members) {
      const at::Tensor& tensor = adapters_[i].tensor;
      const at::Tensor mean = r.packed.narrow(0, offset, tensor.numel()).view(tensor.sizes());
      tensor.mutable_grad() =
          mean.scalar_type() == tensor.scalar_type() ? mean.detach() : mean.to(tensor.scalar_type());
      offset += tensor.numel();
    }
  }
  in_flight_.clear();
}

}  // namespace loom::sharding

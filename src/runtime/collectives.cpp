#include <loom/base/text.hpp>
#include <loom/runtime/collectives.hpp>
#include <loom/runtime/failpoints.hpp>
#include <loom/runtime/host_reads.hpp>
#include <loom/runtime/tensors.hpp>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>
#include <utility>
#include <vector>

namespace loom {
namespace {

// A contiguous flat view when the tensor allows one, otherwise a contiguous flat copy.
at::Tensor flat_contiguous(const at::Tensor& tensor) { return tensor.contiguous().view(-1); }

}  // namespace

pending_collective::pending_collective() = default;
pending_collective::pending_collective(c10::intrusive_ptr<c10d::Work> work, std::function<void()> then,
                                       collective_label label)
    : work_(std::move(work)), then_(std::move(then)), label_(std::move(label)) {}
pending_collective::~pending_collective() = default;
pending_collective::pending_collective(pending_collective&&) noexcept = default;
pending_collective& pending_collective::operator=(pending_collective&&) noexcept = default;

void pending_collective::wait() {
  if (work_) {
    auto work = std::exchange(work_, {});
    {
      const job_progress::wait_scope waiting(work->isCompleted() ? nullptr : label_.progress, label_.number,
                                             std::move(label_.what), std::move(label_.group));
      work->wait();
    }
    if (label_.progress != nullptr && label_.host_waits) label_.progress->finished(work.get());
  }
  if (then_) std::exchange(then_, {})();
}

bool pending_collective::is_completed() const { return !work_ || work_->isCompleted(); }

pending_collective pending_collective::and_then(std::function<void()> next) && {
  then_ = [first = std::move(then_), next = std::move(next)] {
    if (first) first();
    next();
  };
  return std::move(*this);
}

collectives::collectives(c10::intrusive_ptr<c10d::Backend> backend, int rank, int world_size, bool stage_through_host,
                         job_progress* progress, collective_group group)
    : backend_(std::move(backend)),
      rank_(rank),
      world_size_(world_size),
      stage_through_host_(stage_through_host),
      progress_(progress),
      group_(std::move(group)) {
  if (world_size_ > 1 && !backend_) {
    throw_error<std::invalid_argument>("collectives over more than one rank need a c10d backend");
  }
  device_ordered_ = backend_ && backend_->getBackendName() == "nccl";
}

collectives::~collectives() = default;

template <class Start>
pending_collective collectives::issue(std::string_view op, const at::Tensor& tensor, Start start,
                                      std::function<void()> then) {
  failpoint("collective.issue");
  if (injected_skip("collective.issue")) return {};
  c10::intrusive_ptr<c10d::Work> work = start();
  collective_label label{
      .progress = progress_, .number = ++issued_, .what = {}, .group = {}, .host_waits = !device_ordered_};
  if (progress_ != nullptr) {
    label.what = tensor.defined()
                     ? fmt::format("{} {}", op, tensor_spec{{}, tensor.sizes().vec(), tensor.scalar_type()}.layout())
                     : std::string(op);
    label.group = group_;
    progress_->issued({label.number, label.what, label.group}, work);
  }
  return pending_collective(std::move(work), std::move(then), std::move(label));
}

std::int64_t collectives::shard_numel(std::int64_t numel) const noexcept {
  return (numel + world_size_ - 1) / world_size_;
}

// A read of the device on the host, in the step: counted when the job's progress is known.
at::Tensor collectives::read_staged(const at::Tensor& tensor) const {
  return progress_ != nullptr ? read_on_host(*progress_, tensor) : read_on_host_uncounted(tensor);
}

pending_collective collectives::all_reduce(at::Tensor& tensor, reduce_op op) {
  if (!backend_) return {};
  if (staged(tensor)) {
    at::Tensor host = read_staged(tensor);
    return all_reduce(host, op).and_then([tensor, host]() mutable { tensor.copy_(host); });
  }
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions options;
  options.reduceOp = backend_op(op);
  const auto start = [&] { return backend_->allreduce(tensors, options); };
  return issue("all_reduce", tensor, start, divided_after(tensor, op));
}

std::function<void()> collectives::divided_after(const at::Tensor& sum, reduce_op op) const {
  if (op != reduce_op::mean || device_ordered_) return {};
  return [sum, world = world_size_]() mutable { sum.div_(world); };
}

c10d::ReduceOp collectives::backend_op(reduce_op op) const {
  if (op == reduce_op::max) return c10d::ReduceOp(c10d::ReduceOp::MAX);
  return c10d::ReduceOp(op == reduce_op::mean && device_ordered_ ? c10d::ReduceOp::AVG : c10d::ReduceOp::SUM);
}

pending_collective collectives::broadcast(at::Tensor& tensor, int root) {
  if (!backend_) return {};
  if (staged(tensor)) {
    at::Tensor host = read_staged(tensor);
    return broadcast(host, root).and_then([tensor, host]() mutable { tensor.copy_(host); });
  }
  std::vector<at::Tensor> tensors{tensor};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  return issue("broadcast", tensor, [&] { return backend_->broadcast(tensors, options); });
}

std::int64_t collectives::checked_shard_size(std::string_view what, std::int64_t numel, const at::Tensor& shard) const {
  const std::int64_t shard_size = shard_numel(numel);
  if (shard.numel() != shard_size) {
    throw_error<std::invalid_argument>("{} {} elements over {} ranks needs shards of {} elements, got {}", what, numel,
                                       world_size_, shard_size, shard.numel());
  }
  return shard_size;
}

pending_collective collectives::all_gather(const at::Tensor& shard, at::Tensor& flat) {
  const std::int64_t numel = flat.numel();
  const std::int64_t shard_size = checked_shard_size("all_gather into", numel, shard);
  if (!backend_) {
    flat.copy_(shard.reshape(flat.sizes()));
    return {};
  }
  if (staged(flat)) {
    at::Tensor host = at::empty(flat.sizes(), flat.options().device(c10::kCPU));
    return all_gather(read_staged(shard), host).and_then([flat, host]() mutable { flat.copy_(host); });
  }
  at::Tensor input = flat_contiguous(shard);
  const bool direct = flat.is_contiguous() && shard_size * world_size_ == numel;
  at::Tensor output = direct ? flat.view(-1) : at::empty({shard_size * world_size_}, flat.options());
  const auto start = [&] { return backend_->_allgather_base(output, input); };
  if (direct) return issue("all_gather", flat, start);
  return issue("all_gather", flat, start,
               [flat, output, numel]() mutable { flat.copy_(output.narrow(0, 0, numel).view(flat.sizes())); });
}

pending_collective collectives::reduce_scatter(const at::Tensor& flat, at::Tensor& shard, reduce_op op) {
  const std::int64_t numel = flat.numel();
  const std::int64_t shard_size = checked_shard_size("reduce_scatter of", numel, shard);
  // The input is the caller's: pad a copy, never the original.
  at::Tensor input = flat_contiguous(flat);
  if (shard_size * world_size_ != numel) {
    at::Tensor padded = at::zeros({shard_size * world_size_}, flat.options());
    padded.narrow(0, 0, numel).copy_(input);
    input = std::move(padded);
  }
  if (!backend_) {
    shard.copy_(input.view(shard.sizes()));  // the sum and the mean of one rank's
    return {};
  }
  if (staged(input)) {
    at::Tensor host = at::empty(shard.sizes(), shard.options().device(c10::kCPU));
    return reduce_scatter(read_staged(input), host, op).and_then([shard, host]() mutable { shard.copy_(host); });
  }
  if (emulate_reduce_scatter_) {
    pending_collective work = emulated_reduce_scatter(input, shard);
    if (op != reduce_op::mean) return work;
    return std::move(work).and_then([shard, world = world_size_]() mutable { shard.div_(world); });
  }

  const bool direct = shard.is_contiguous();
  at::Tensor output = direct ? shard.view(-1) : at::empty({shard_size}, shard.options());
  c10d::ReduceScatterOptions options;
  options.reduceOp = backend_op(op);
  const auto start = [&] { return backend_->_reduce_scatter_base(output, input, options); };
  if (direct) return issue("reduce_scatter", input, start, divided_after(shard, op));
  return issue("reduce_scatter", input, start, [shard, output, mean = divided_after(shard, op)]() mutable {
    shard.copy_(output.view(shard.sizes()));
    if (mean) mean();
  });
}

pending_collective collectives::emulated_reduce_scatter(const at::Tensor& padded, at::Tensor& shard) {
  at::Tensor reduced = padded.clone();  // all-reduce works in place; the input may be the caller's
  std::vector<at::Tensor> tensors{reduced};
  c10d::AllreduceOptions options;
  options.reduceOp = backend_op(reduce_op::sum);
  const std::int64_t shard_size = shard.numel();
  const auto start = [&] { return backend_->allreduce(tensors, options); };
  return issue("all_reduce", reduced, start, [shard, reduced, offset = rank_ * shard_size]() mutable {
    shard.copy_(reduced.narrow(0, offset, shard.numel()).view(shard.sizes()));
  });
}

pending_collective collectives::all_to_all(const at::Tensor& input, at::Tensor& output) {
  if (input.sizes() != output.sizes() || input.size(0) % world_size_ != 0) {
    throw_error<std::invalid_argument>(
        "all_to_all of [{}] into [{}] over {}: give an output of the input's shape, whose first dimension the group "
        "size divides",
        fmt::join(input.sizes(), ", "), fmt::join(output.sizes(), ", "), counted(world_size_, "rank"));
  }
  if (!backend_) {
    output.copy_(input);
    return {};
  }
  if (staged(input)) {
    at::Tensor host = at::empty(output.sizes(), output.options().device(c10::kCPU));
    return all_to_all(read_staged(input), host).and_then([output, host]() mutable { output.copy_(host); });
  }
  at::Tensor send = input.contiguous();
  const bool direct = output.is_contiguous();
  at::Tensor received = direct ? output : at::empty(output.sizes(), output.options());
  std::vector<std::int64_t> equal_splits;  // c10d's "equal blocks" when both are empty
  const auto start = [&] { return backend_->alltoall_base(received, send, equal_splits, equal_splits); };
  if (direct) return issue("all_to_all", send, start);
  return issue("all_to_all", send, start, [output, received]() mutable { output.copy_(received); });
}

pending_collective collectives::barrier() {
  if (!backend_) return {};
  return issue("barrier", at::Tensor(), [&] { return backend_->barrier(); });
}

}  // namespace loom

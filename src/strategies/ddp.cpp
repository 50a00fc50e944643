#include <loom/strategies/ddp.hpp>

#include <loom/base/text.hpp>
#include <loom/nn/branch.hpp>
#include <loom/runtime/failpoints.hpp>
#include <loom/schedule/schedule.hpp>
#include <loom/strategies/buckets.hpp>

#include <ATen/core/grad_mode.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/logger.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string_view>
#include <type_traits>
#include <unordered_map>

namespace loom {
namespace {

constexpr std::int64_t mib = 1024 * 1024;
// PyTorch DDP's first_bucket_bytes_cap: a small first bucket starts communication early.
constexpr std::int64_t first_bucket_bytes = 1 * mib;

struct reducer_arguments {
  std::vector<at::Tensor> params;
  std::vector<std::vector<std::size_t>> buckets;
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  std::vector<bool> sparse;
  std::int64_t bucket_bytes_cap;
  bool find_unused_parameters;
  bool gradient_as_bucket_view;
  std::unordered_map<std::size_t, std::string> names;
  std::int64_t first_bucket_bytes_cap;
};

// The Reducer's constructor grew arguments across 2.x releases: pick the form this LibTorch has.
// (A template, so that the forms this LibTorch lacks are discarded rather than compiled.)
template <class Reducer = c10d::Reducer>
std::shared_ptr<Reducer> make_reducer(reducer_arguments a) {
  using tensors = std::vector<at::Tensor>;
  using indices = std::vector<std::vector<std::size_t>>;
  using group = c10::intrusive_ptr<c10d::ProcessGroup>;
  using names = std::unordered_map<std::size_t, std::string>;
  constexpr bool since_2_13 =
      std::is_constructible_v<Reducer, tensors, indices, group, std::vector<bool>, std::int64_t, bool, bool, names,
                              std::int64_t, bool, bool, std::vector<std::int64_t>>;
  constexpr bool since_2_6 = std::is_constructible_v<Reducer, tensors, indices, group, std::vector<bool>, std::int64_t,
                                                     bool, bool, names, std::int64_t, bool, bool>;
  constexpr bool since_2_0 = std::is_constructible_v<Reducer, tensors, indices, group, std::vector<bool>, std::int64_t,
                                                     bool, bool, names, std::int64_t>;
  auto args = [&](auto... extra) {
    return std::make_shared<Reducer>(std::move(a.params), std::move(a.buckets), std::move(a.group), std::move(a.sparse),
                                     a.bucket_bytes_cap, a.find_unused_parameters, a.gradient_as_bucket_view,
                                     std::move(a.names), a.first_bucket_bytes_cap, extra...);
  };
  // skip_all_reduce_unused_params, use_python_reducer, and (2.13) per-bucket caps for rebuilding
  // (none: the rebuild packs by bucket_cap_mb, its first bucket by first_bucket_bytes, as DDP's).
  if constexpr (since_2_13) {
    return args(false, false, std::vector<std::int64_t>{});
  } else if constexpr (since_2_6) {
    return args(false, false);
  } else {
    static_assert(since_2_0, "this LibTorch's c10d::Reducer constructor is not known to loom: add its form here");
    return args();
  }
}

// Under static_graph every step must use the parameters that the recording step used (PyTorch's
// contract): the Reducer expects exactly those gradients in every later step.
constexpr std::string_view static_graph_contract =
    "under ddp({.static_graph = true}) every step must use the same parameters as the first "
    "synchronised step, which recorded the graph: drop static_graph, and pass "
    "find_unused_parameters = true if the set of used parameters changes between steps";

// Which trainable parameters received a gradient in this step (a hook on each parameter sets its
// flag), and under static_graph which ones the recording step used.
struct gradient_record {
  std::vector<char> produced;
  std::vector<char> recorded;
  bool has_recording = false;
  int step = 0;  // synchronised steps so far, for messages
};

}  // namespace

// Everything PyTorch's DistributedDataParallel gives its Reducer that a code path may use, read off
// reducer.cpp (the stored sources span 2.4 to recent releases and agree on these points; the 2.13
// header declares the same members, plus use_python_reducer and skip_all_reduce_unused_params,
// which make_reducer passes as PyTorch's defaults, false):
// - a Logger (set_logger): the Reducer keeps a weak reference and, in search_unused_parameters,
//   calls logger_.lock()->log_if_graph_static(false) without a check when the set of unused
//   parameters changes between steps (a null dereference without one); its REDUCER_CHECKs log to
//   it when it is set. DDP holds the Logger beside the Reducer, as state does here;
// - static_graph told to the Logger as well as the Reducer (DDP's _set_static_graph);
// - the comm hook, mixed-precision dtype, sparse metadata and forward-pass work handle are optional
//   and checked before use; loom sets none of them;
// - local_used_map_ exists only with find_unused_parameters or static_graph, and the code paths that
//   read it are those two modes';
// - delay_all_reduce after the recording step of static_graph (DDP queues it from _DDPSink).
// - rebuild_buckets() at the start of each synchronised forward with gradients on, as DDP's forward
//   calls it: once, after the first synchronised backward, the Reducer rebuilds its buckets in the
//   order gradients became ready (rank 0's order, which it broadcasts), and from then on stops
//   recording that order (which it would otherwise append to every step). loom then rewrites its
//   entries of the schedule and checks the schedule across ranks again.
struct ddp_engine::state {
  std::shared_ptr<c10d::Reducer> reducer;
  std::shared_ptr<c10d::Logger> logger;  // holds the Reducer; declared after it, so destroyed first
  std::shared_ptr<gradient_record> gradients;
  std::size_t first_entry = 0;  // where the buckets' entries start in the schedule
};

ddp_engine::ddp_engine(const ddp_options& settings) : settings_(settings) {}

void ddp_engine::setup(strategy_context& context) {
  const runtime& rt = context.rt();
  const auto& params = context.trainable();
  if (params.empty()) {
    throw_error<std::invalid_argument>(
        "ddp(): the plan leaves no trainable parameter: there is nothing to synchronise. Check that "
        "lora(...) matches layers or that trainable(...) names parameters, or use local()");
  }
  if (const std::vector<nn::branch_module> branches = nn::find_branches(context.module()); !branches.empty()) {
    throw_error<std::invalid_argument>(
        "ddp(): the model has branches ('{}' and the rest), of which a pass runs one: c10d's reducer would wait for "
        "gradients of every branch, and reduce them all each step; use fsdp(), whose schedule issues the collectives "
        "of the branch a pass takes and no others",
        branches.front().name);
  }
  if (!rt.is_distributed()) {
    context.note("ddp: a single rank, nothing to synchronise");
    return;
  }
  context.require_process_group(name);
  if (const std::optional<precision_policy>& precision = context.precision()) {
    for (const named_tensor& p : params) {
      if (p.tensor.scalar_type() == precision->reduce) continue;
      throw_error<std::invalid_argument>(
          "ddp(): mixed_precision reduce = {} differs from the dtype of the gradients ('{}' is {}), which the "
          "Reducer's buckets reduce as they are: keep reduce = fp32 under ddp() (fp32 parameters have fp32 "
          "gradients under autocast), or use fsdp(), which reduce-scatters in the reduce dtype",
          c10::toString(precision->reduce), p.name, c10::toString(p.tensor.scalar_type()));
    }
  }

  const auto cap = static_cast<std::int64_t>(settings_.bucket_cap_mb) * mib;
  // Reverse registration order, the order in which backward produces gradients.
  std::vector<std::size_t> order(params.size());
  std::iota(order.rbegin(), order.rend(), std::size_t{0});
  buckets_ = assign_buckets(
      params, order, [cap](std::size_t bucket) { return bucket == 0 ? std::min(first_bucket_bytes, cap) : cap; });
  state_ = std::make_shared<state>();
  state_->first_entry = context.schedule().entries().size();
  add_schedule_entries(context);
  start_reducer(context, cap);
  watch_gradients(context);
  note_buckets(context, "");
}

schedule_entry ddp_engine::bucket_entry(const strategy_context& context, std::size_t bucket) const {
  const auto& params = context.trainable();
  schedule_entry entry{collective_op::all_reduce, step_phase::backward, {}, "world"};
  for (std::size_t i : buckets_[bucket]) {
    const at::Tensor& p = params[i].tensor;
    entry.tensors.push_back({params[i].name, p.sizes().vec(), p.scalar_type()});
  }
  return entry;
}

void ddp_engine::add_schedule_entries(strategy_context& context) const {
  for (std::size_t b = 0; b < buckets_.size(); ++b) context.schedule().add(bucket_entry(context, b));
  if (settings_.broadcast_buffers) {
    for (const auto& buffer : context.module().named_buffers()) {
      context.schedule().add({collective_op::broadcast,
                              step_phase::forward,
                              {{buffer.key(), buffer.value().sizes().vec(), buffer.value().scalar_type()}},
                              "world"});
    }
  }
}

void ddp_engine::start_reducer(strategy_context& context, std::int64_t bucket_cap_bytes) {
  const auto& params = context.trainable();
  reducer_arguments args;
  for (std::size_t i = 0; i < params.size(); ++i) {
    args.params.push_back(params[i].tensor);
    args.names.emplace(i, params[i].name);
  }
  args.buckets = buckets_;
  args.group = context.rt().process_group();
  args.sparse.assign(params.size(), false);
  args.bucket_bytes_cap = bucket_cap_bytes;
  args.find_unused_parameters = settings_.find_unused_parameters;
  args.gradient_as_bucket_view = settings_.gradient_as_bucket_view;
  args.first_bucket_bytes_cap = first_bucket_bytes;

  state_->reducer = make_reducer(std::move(args));
  state_->logger = std::make_shared<c10d::Logger>(state_->reducer);
  state_->reducer->set_logger(state_->logger);
  state_->logger->set_construction_data_and_log(context.module().name(), /*device_ids=*/{}, /*output_device=*/-1,
                                                settings_.broadcast_buffers, /*has_sync_bn=*/false,
                                                settings_.static_graph);
  if (settings_.static_graph) {
    state_->reducer->set_static_graph();
    state_->logger->set_static_graph();
  }
}

void ddp_engine::watch_gradients(strategy_context& context) {
  const auto& params = context.trainable();
  auto record = std::make_shared<gradient_record>();
  record->produced.assign(params.size(), 0);
  record->recorded.assign(params.size(), 0);
  const bool static_graph = settings_.static_graph;
  const strategy_context* job = &context;  // on the heap, for the job's life: the hooks' too
  for (std::size_t i = 0; i < params.size(); ++i) {
    at::Tensor tensor = params[i].tensor;
    // Runs before the gradient is accumulated, so before the Reducer's own hook sees it.
    tensor.register_hook([record, i, static_graph, job, name = params[i].name](const at::Tensor&) {
      failpoint("step.backward");  // mid backward: the peers go on into the bucket's all-reduce
      record->produced[i] = 1;
      if (static_graph && record->has_recording && !record->recorded[i]) {
        job->fail(
            fmt::format("ddp(): parameter '{}' received a gradient on rank {} in step {}, but none in the step "
                        "that recorded the graph; {}",
                        name, job->rt().rank(), record->step + 1, static_graph_contract));
      }
    });
  }
  state_->gradients = std::move(record);
}

void ddp_engine::note_buckets(strategy_context& context, std::string_view when) const {
  std::string sizes;
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    sizes += fmt::format("{}{:.2f}", b ? ", " : "",
                         static_cast<double>(context.schedule().entries()[state_->first_entry + b].bytes()) / mib);
  }
  context.note(fmt::format("ddp: {}{} over {}, MiB each: [{}]", when,
                           counted(static_cast<std::int64_t>(buckets_.size()), "gradient bucket"),
                           counted(context.rt().world_size(), "rank"), sizes));
}

void ddp_engine::rebuild_buckets(strategy_context& context) {
  if (!state_->reducer->rebuild_buckets()) return;
  const auto& params = context.trainable();
  std::unordered_map<const c10::TensorImpl*, std::size_t> index_of;
  for (std::size_t i = 0; i < params.size(); ++i) index_of.emplace(params[i].tensor.unsafeGetTensorImpl(), i);
  std::vector<std::vector<std::size_t>> rebuilt;
  for (const c10d::GradBucket& bucket : state_->reducer->get_grad_buckets(/*return_zero_tensors=*/false)) {
    std::vector<std::size_t>& indices = rebuilt.emplace_back();
    for (const at::Tensor& p : bucket.getParameters()) indices.push_back(index_of.at(p.unsafeGetTensorImpl()));
  }

  // The same schedule, with the buckets' entries (in a row from first_entry) in their new order.
  const auto entries = context.schedule().entries();
  const std::size_t after_buckets = state_->first_entry + buckets_.size();
  buckets_ = std::move(rebuilt);
  collective_schedule schedule;
  for (std::size_t e = 0; e < state_->first_entry; ++e) schedule.add(entries[e]);
  for (std::size_t b = 0; b < buckets_.size(); ++b) schedule.add(bucket_entry(context, b));
  for (std::size_t e = after_buckets; e < entries.size(); ++e) schedule.add(entries[e]);
  context.schedule() = std::move(schedule);
  verify_schedule_across_ranks(context.schedule(), context.rt());
  note_buckets(context, "rebuilt in the order the first synchronised step's gradients became ready: ");
}

void ddp_engine::before_forward(strategy_context& context) {
  if (!state_ || !context.sync_gradients()) return;
  if (at::GradMode::is_enabled()) rebuild_buckets(context);
  state_->reducer->prepare_for_forward();
  if (settings_.broadcast_buffers) {
    for (auto& buffer : context.module().buffers()) context.rt().comm().broadcast(buffer, 0).wait();
  }
}

void ddp_engine::before_backward(strategy_context& context, const at::Tensor& loss) {
  if (!state_) return;
  auto& produced = state_->gradients->produced;
  std::fill(produced.begin(), produced.end(), 0);
  if (!context.sync_gradients()) return;
  state_->reducer->prepare_for_backward(settings_.find_unused_parameters ? std::vector<at::Tensor>{loss}
                                                                         : std::vector<at::Tensor>{});
}

void ddp_engine::after_backward(strategy_context& context) {
  if (!state_ || !context.sync_gradients()) return;
  gradient_record& record = *state_->gradients;
  ++record.step;
  if (settings_.static_graph) {
    check_static_graph(context);
  } else if (!settings_.find_unused_parameters) {
    check_every_gradient_produced(context);
  }
  if (settings_.gradient_as_bucket_view) hand_out_bucket_bytes(context);
}

// The Reducer sets each gradient to a view of its bucket, which LibTorch's Optimizer::zero_grad
// cannot detach in place (Python's detaches only a gradient with a grad_fn). The same bytes through
// a tensor that is not a view are what the Reducer accepts next step (it checks that the gradient
// shares the bucket's storage) and what a user's optimizer can zero, as under PyTorch's DDP.
void ddp_engine::hand_out_bucket_bytes(strategy_context& context) const {
  for (const named_tensor& p : context.trainable()) {
    at::Tensor& grad = p.tensor.mutable_grad();
    if (grad.defined() && grad.is_view()) grad = grad.detach();
  }
}

void ddp_engine::check_static_graph(strategy_context& context) {
  gradient_record& record = *state_->gradients;
  if (!record.has_recording) {
    // The recording step: reduce every bucket now, as DDP's _DDPSink queues it after this backward.
    state_->reducer->delay_all_reduce();
    record.recorded = record.produced;
    record.has_recording = true;
    return;
  }
  for (std::size_t i = 0; i < record.produced.size(); ++i) {
    if (record.produced[i] || !record.recorded[i]) continue;
    context.fail(fmt::format(
        "ddp(): parameter '{}' received no gradient on rank {} in step {}, but one in the step that recorded the "
        "graph; {}",
        context.trainable()[i].name, context.rt().rank(), record.step, static_graph_contract));
  }
}

void ddp_engine::check_every_gradient_produced(strategy_context& context) const {
  const auto& produced = state_->gradients->produced;
  for (std::size_t i = 0; i < produced.size(); ++i) {
    if (produced[i]) continue;
    context.fail(fmt::format(
        "ddp(): parameter '{}' received no gradient on rank {} in this step, so the all-reduce of its bucket "
        "cannot complete on the other ranks. If some parameters may go unused in a step, pass "
        "ddp({{.find_unused_parameters = true}}): their gradients then count as zero in the average",
        context.trainable()[i].name, context.rt().rank()));
  }
}

}  // namespace loom

#include <loom/strategies/ddp.hpp>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include <fmt/format.h>

#include <type_traits>
#include <unordered_map>

namespace loom {
namespace {

constexpr std::int64_t mib = 1024 * 1024;
// PyTorch DDP's first_bucket_bytes_cap: a small first bucket starts communication early.
constexpr std::int64_t first_bucket_bytes = 1 * mib;

// Reverse registration order, the order in which backward produces gradients; a new bucket when
// the cap is reached or the dtype changes.
std::vector<std::vector<std::size_t>> assign_buckets(const std::vector<named_parameter>& params,
                                                     std::int64_t cap_bytes) {
  std::vector<std::vector<std::size_t>> buckets;
  std::int64_t filled = 0;
  for (std::size_t i = params.size(); i-- > 0;) {
    const at::Tensor& p = params[i].tensor;
    const std::int64_t limit = buckets.size() <= 1 ? std::min(first_bucket_bytes, cap_bytes) : cap_bytes;
    const bool fits = !buckets.empty() && filled < limit &&
                      params[buckets.back().front()].tensor.scalar_type() == p.scalar_type();
    if (!fits) {
      buckets.emplace_back();
      filled = 0;
    }
    buckets.back().push_back(i);
    filled += static_cast<std::int64_t>(p.nbytes());
  }
  return buckets;
}

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
std::unique_ptr<Reducer> make_reducer(reducer_arguments a) {
  using tensors = std::vector<at::Tensor>;
  using indices = std::vector<std::vector<std::size_t>>;
  using group = c10::intrusive_ptr<c10d::ProcessGroup>;
  using names = std::unordered_map<std::size_t, std::string>;
  constexpr bool since_2_13 = std::is_constructible_v<Reducer, tensors, indices, group, std::vector<bool>, std::int64_t,
                                                      bool, bool, names, std::int64_t, bool, bool,
                                                      std::vector<std::int64_t>>;
  constexpr bool since_2_6 = std::is_constructible_v<Reducer, tensors, indices, group, std::vector<bool>, std::int64_t,
                                                     bool, bool, names, std::int64_t, bool, bool>;
  constexpr bool since_2_0 = std::is_constructible_v<Reducer, tensors, indices, group, std::vector<bool>, std::int64_t,
                                                     bool, bool, names, std::int64_t>;
  auto args = [&](auto... extra) {
    return std::make_unique<Reducer>(std::move(a.params), std::move(a.buckets), std::move(a.group), std::move(a.sparse),
                                     a.bucket_bytes_cap, a.find_unused_parameters, a.gradient_as_bucket_view,
                                     std::move(a.names), a.first_bucket_bytes_cap, extra...);
  };
  // skip_all_reduce_unused_params, use_python_reducer, and (2.13) per-bucket caps for rebuilding,
  // which loom never does: a rebuilt bucket layout would leave the checked schedule.
  if constexpr (since_2_13) {
    return args(false, false, std::vector<std::int64_t>{});
  } else if constexpr (since_2_6) {
    return args(false, false);
  } else {
    static_assert(since_2_0, "this LibTorch's c10d::Reducer constructor is not known to loom: add its form here");
    return args();
  }
}

}  // namespace

struct ddp_engine::state {
  std::unique_ptr<c10d::Reducer> reducer;
  // static_graph: the Reducer only records the graph in its first synchronised step and reduces
  // every bucket at its end (what PyTorch's DDP queues after that step's backward).
  bool static_graph_recorded = false;
  std::shared_ptr<std::vector<char>> produced_gradient;  // per trainable parameter, this step
};

ddp_engine::ddp_engine(const ddp_options& settings) : settings_(settings) {}
ddp_engine::ddp_engine(ddp_engine&&) noexcept = default;
ddp_engine& ddp_engine::operator=(ddp_engine&&) noexcept = default;
ddp_engine::~ddp_engine() = default;

void ddp_engine::setup(strategy_context& context) {
  const runtime& rt = context.rt();
  const auto& params = context.trainable();
  if (params.empty()) {
    throw std::invalid_argument(
        "loom: ddp(): the plan leaves no trainable parameter: there is nothing to synchronise. Check that "
        "lora(...) matches layers or that trainable(...) names parameters, or use local()");
  }
  if (!rt.is_distributed()) {
    context.note("ddp: a single rank, nothing to synchronise");
    return;
  }
  if (!rt.process_group()) {
    throw std::invalid_argument(fmt::format(
        "loom: ddp(): world size {} needs a process group: create the runtime with loom::runtime::from_env() "
        "in a program started by loom-run or torchrun",
        rt.world_size()));
  }

  const auto cap = static_cast<std::int64_t>(settings_.bucket_cap_mb) * mib;
  buckets_ = assign_buckets(params, cap);
  for (const auto& bucket : buckets_) {
    schedule_entry entry{collective_op::all_reduce, step_phase::backward, {}, "world"};
    for (std::size_t i : bucket) {
      const at::Tensor& p = params[i].tensor;
      entry.tensors.push_back({params[i].name, p.sizes().vec(), p.scalar_type()});
    }
    context.schedule().add(std::move(entry));
  }
  if (settings_.broadcast_buffers) {
    for (const auto& buffer : context.module().named_buffers()) {
      context.schedule().add({collective_op::broadcast, step_phase::forward,
                              {{buffer.key(), buffer.value().sizes().vec(), buffer.value().scalar_type()}}, "world"});
    }
  }

  reducer_arguments args;
  for (std::size_t i = 0; i < params.size(); ++i) {
    args.params.push_back(params[i].tensor);
    args.names.emplace(i, params[i].name);
  }
  args.buckets = buckets_;
  args.group = rt.process_group();
  args.sparse.assign(params.size(), false);
  args.bucket_bytes_cap = cap;
  args.find_unused_parameters = settings_.find_unused_parameters;
  args.gradient_as_bucket_view = settings_.gradient_as_bucket_view;
  args.first_bucket_bytes_cap = first_bucket_bytes;

  state_ = std::make_unique<state>();
  state_->reducer = make_reducer(std::move(args));
  if (settings_.static_graph) state_->reducer->set_static_graph();

  // Which parameters received a gradient this step: without find_unused_parameters, a missing one
  // would leave its bucket's all-reduce waiting on the other ranks.
  state_->produced_gradient = std::make_shared<std::vector<char>>(params.size(), 0);
  for (std::size_t i = 0; i < params.size(); ++i) {
    auto flags = state_->produced_gradient;
    at::Tensor tensor = params[i].tensor;
    tensor.register_hook([flags, i](const at::Tensor&) { (*flags)[i] = 1; });
  }

  std::string sizes;
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    sizes += fmt::format("{}{:.2f}", b ? ", " : "", static_cast<double>(context.schedule().entries()[b].bytes()) / mib);
  }
  context.note(fmt::format("ddp: {} gradient buckets over {} ranks, MiB each: [{}]", buckets_.size(), rt.world_size(),
                           sizes));
}

void ddp_engine::before_forward(strategy_context& context) {
  if (!state_ || !context.sync_gradients()) return;
  state_->reducer->prepare_for_forward();
  if (settings_.broadcast_buffers) {
    for (auto& buffer : context.module().buffers()) context.rt().comm().broadcast(buffer, 0).wait();
  }
}

void ddp_engine::before_backward(strategy_context& context, const at::Tensor& loss) {
  if (!state_) return;
  std::fill(state_->produced_gradient->begin(), state_->produced_gradient->end(), 0);
  if (!context.sync_gradients()) return;
  state_->reducer->prepare_for_backward(settings_.find_unused_parameters ? std::vector<at::Tensor>{loss}
                                                                          : std::vector<at::Tensor>{});
}

void ddp_engine::after_backward(strategy_context& context) {
  if (!state_ || !context.sync_gradients()) return;
  if (settings_.static_graph && !state_->static_graph_recorded) {
    state_->reducer->delay_all_reduce();
    state_->static_graph_recorded = true;
  }
  if (settings_.find_unused_parameters) return;
  const auto& produced = *state_->produced_gradient;
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

// Ranks that disagree must fail together, fast, with a message that names what differs, never
// hang. Usage (under loom-run): dist-failures MODE. Every rank expects its error; it prints it and
// exits 0 when the message and the time are as they should be, 1 otherwise.
#include "branchy.hpp"
#include "odd_units.hpp"
#include "two_experts.hpp"
#include "world.hpp"

#include <loom/loom.hpp>
#include <loom/runtime/mesh.hpp>
#include <models/mlp.hpp>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <thread>

using loom::testing::branchy;
using loom::testing::odd_units;
using loom::testing::TwoExperts;
using loom::testing::world;

namespace {

bool last_rank() { return world().rank() == world().world_size() - 1; }

// Started by peer_death.py rather than loom-run, which would stop the survivors itself: `victim`
// dies by SIGKILL in its second backward, after its first bucket's all-reduce began.
void killed_in_backward(int victim) {
  auto job = loom::build(loom::model<models::Mlp>(512, 4) | loom::seeded(3) | loom::ddp(), world());
  auto backwards = std::make_shared<int>(0);
  if (world().rank() == victim) {
    job.module().layers[0]->as<loom::nn::LinearImpl>()->weight.register_hook([backwards](const at::Tensor&) {
      if (++*backwards == 2) std::raise(SIGKILL);
    });
  }
  auto x = torch::randn({4, 512});
  for (int step = 0; step < 3; ++step) job.backward(job.forward(x).square().mean());
}

// Rank 1 dies while the others wait in collectives of their hybrid-sharding groups (4 ranks: shard
// groups {0, 1} and {2, 3}, replicate groups {0, 2} and {1, 3}). Rank 3's replicate collective breaks
// with it, and rank 3 lives on (peer_death.py keeps each survivor alive a while after its error, as a
// program that caught it would), while rank 2 waits on rank 3 in their shard group's collective, which
// rank 3 never joins: rank 3's broken connections must end that wait, not its exit or the timeout.
void waiting_on_a_failed_rank() {
  const loom::runtime& rt = world();
  const loom::rank_mesh mesh(rt, 2);
  at::Tensor values = at::ones({1024});
  try {
    if (rt.rank() == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(1));  // the others' mesh is made and their waits begun
      std::raise(SIGKILL);
    }
    (rt.rank() == 3 ? mesh.replicate() : mesh.shard()).all_reduce(values).wait();
  } catch (...) {
    loom::rethrow_as_job_failure(rt, std::current_exception(), "all-reduce");
  }
}

// A strategy whose one collective's group is the rank's choice: hybrid sharding's shard group on
// one rank, its replicate group on another, would be mismatched collectives.
struct grouped_strategy {
  static constexpr std::string_view name = "grouped";
  bool in_shard_group = false;

  [[nodiscard]] std::string options() const { return {}; }
  void setup(loom::strategy_context& context) const {
    context.schedule().add({loom::collective_op::all_reduce,
                            loom::step_phase::backward,
                            {{"w", {4}, at::kFloat}},
                            in_shard_group ? "shard[2]" : "replicate[2]"});
  }
  void before_forward(loom::strategy_context&) const {}
  void after_backward(loom::strategy_context&) const {}
};

// Two MLPs under tensor_parallel(2), each a colwise layer and a rowwise one, whose forward runs them in
// the registered order except on the last rank, which runs the second first: its rowwise layer's sum
// would meet the other ranks' sum of the first MLP's.
struct swapped_mlps : torch::nn::Module {
  explicit swapped_mlps(bool split_otherwise_ = false)
      : split_otherwise(split_otherwise_),
        up_a(register_module("up_a", loom::nn::Linear(8, 16))),
        down_a(register_module("down_a", loom::nn::Linear(16, 8))),
        up_b(register_module("up_b", loom::nn::Linear(8, 16))),
        down_b(register_module("down_b", loom::nn::Linear(16, 8))) {}
  // With `split_otherwise`, the last rank splits down_b by its outputs: its group's sums differ.
  [[nodiscard]] std::vector<loom::nn::parallel_layer> tensor_parallel_plan() const {
    using loom::nn::parallel_style;
    return {{"up_a", parallel_style::colwise},
            {"down_a", parallel_style::rowwise},
            {"up_b", parallel_style::colwise},
            {"down_b", split_otherwise && last_rank() ? parallel_style::colwise : parallel_style::rowwise}};
  }
  at::Tensor forward(const at::Tensor& x) {
    if (last_rank()) {
      const at::Tensor b = down_b(up_b(x).relu());
      return down_a(up_a(x).relu()) + b;
    }
    return down_a(up_a(x).relu()) + down_b(up_b(x).relu());
  }
  bool split_otherwise;
  loom::nn::Linear up_a, down_a, up_b, down_b;
};

// odd_units whose forward leaves out unit `skipped` on the last rank, or calls it through its inner
// type (bypassing loom::nn::Unit) on every rank.
struct unit_misuse : odd_units {
  at::Tensor forward(const at::Tensor& x, std::size_t skipped, bool bypass) {
    at::Tensor h = in(x);
    for (std::size_t i = 0; i < blocks->size(); ++i) {
      if (i != skipped) {
        h = blocks[i]->as<Block>()->forward(h);
      } else if (bypass) {
        h = blocks[i]->as<loom::testing::odd_block>()->forward(h);
      } else if (!last_rank()) {
        h = blocks[i]->as<Block>()->forward(h);
      }
    }
    return out(h);
  }
};

// The last rank holds its blocks as plain odd_blocks, the others as units: the same parameters and
// draws, so the replica check passes and the schedule check must catch it.
struct units_on_some_ranks : torch::nn::Module {
  units_on_some_ranks() : blocks(register_module("blocks", torch::nn::ModuleList())) {
    for (int i = 0; i < 2; ++i) {
      if (last_rank()) {
        blocks->push_back(std::make_shared<loom::testing::odd_block>());
      } else {
        blocks->push_back(std::make_shared<odd_units::Block>());
      }
    }
  }
  at::Tensor forward(at::Tensor x) {
    for (auto& block : *blocks) x = block->as<loom::testing::odd_block>()->forward(x);
    return x;
  }
  torch::nn::ModuleList blocks;
};

void misuse_units(bool bypass) {
  auto job = loom::build(loom::model<unit_misuse>() | loom::seeded(3) | loom::fsdp(), world());
  auto x = torch::randn({4, 5});
  for (int step = 0; step < 3; ++step) job.backward(job.forward(x, step == 1 ? 1 : 99, bypass).square().mean());
}

// An Mlp whose forward rejects a batch, as a user's own data check would: the error of one rank's
// forward, while the others go on into the step's collectives.
struct rejects_a_batch : models::Mlp {
  rejects_a_batch() : models::Mlp(64, 3) {}
  at::Tensor forward(const at::Tensor& x, bool reject) {
    if (reject) throw std::invalid_argument("bad batch: token 999 is not in the vocabulary of 128");
    return models::Mlp::forward(x);
  }
};

template <class Strategy>
void user_error_in_forward(Strategy strategy) {
  auto job = loom::build(loom::model<rejects_a_batch>() | loom::seeded(3) | strategy, world());
  auto x = torch::randn({4, 64});
  for (int step = 0; step < 3; ++step) job.backward(job.forward(x, step == 1 && last_rank()).square().mean());
}

// The rank whose forward threw has its own error, unchanged; every other rank names it and the step
// part it was in when the job broke.
constexpr const char* user_error =
    "^(bad batch: token 999 is not in the vocabulary of 128|loom: rank \\d failed: bad batch: token 999 is not in "
    "the vocabulary of 128; then rank \\d's (forward|backward) pass failed)$";

struct scenario {
  std::function<void()> run;  // must throw
  std::string expected;       // a regex the message must contain
};

const std::map<std::string, scenario>& scenarios() {
  static const std::map<std::string, scenario> all{
      {"different-model",
       {[] {
          // The last rank builds one more layer, as if an environment variable chose the depth.
          auto job =
              loom::build(loom::model<models::Mlp>(8, last_rank() ? 4 : 3) | loom::seeded(3) | loom::ddp(), world());
        },
        "seeded\\(3\\) should build bit-identical replicas on every rank, but tensor #6 differs between rank 0 "
        "\\('\\(none\\)'\\) and rank \\d \\('layers.3.weight Float\\[8,8\\]'\\)"}},
      {"different-values",
       {[] {
          auto job =
              loom::build(loom::model<models::Mlp>(8, 3) | loom::seeded(last_rank() ? 4 : 3) | loom::ddp(), world());
        },
        "tensor #0 differs between rank 0 \\('layers.0.weight Float\\[8,8\\]'\\) and rank \\d .* in its values"}},
      {"different-schedule",
       {[] {
          const std::size_t cap = last_rank() ? 1 : 25;
          auto job = loom::build(loom::model<models::Mlp>(512, 4) | loom::seeded(3) | loom::ddp({.bucket_cap_mb = cap}),
                                 world());
        },
        "the ranks' collective schedules differ.*first difference at entry #1: rank 0 has 'all_reduce backward "
        "world \\d+ B \\[layers.2.bias"}},
      {"different-group",
       {[] {
          auto job = loom::build(loom::model<models::Mlp>(8, 3) | loom::seeded(3) |
                                     loom::strategy(grouped_strategy{.in_shard_group = last_rank()}),
                                 world());
        },
        "the ranks' collective schedules differ.*first difference at entry #0: rank 0 has 'all_reduce backward "
        "replicate\\[2\\] 16 B \\[w Float\\[4\\]\\]'.*shard\\[2\\]"}},
      {"different-precision",
       {[] {
          // The last rank leaves mixed_precision out: its gathers would carry fp32, the others' bf16.
          const auto plan = loom::model<models::Mlp>(512, 4) | loom::seeded(3);
          if (last_rank()) {
            auto job = loom::build(plan | loom::fsdp(), world());
          } else {
            auto job = loom::build(plan | loom::mixed_precision() | loom::fsdp(), world());
          }
        },
        "the ranks' collective schedules differ.*first difference at entry #0: rank 0 has 'all_gather forward "
        "world \\d+ B \\[layers.0.weight BFloat16"}},
      {"static-graph-stops-using",
       {[] {
          // The last rank leaves `extra` out in the third step: a graph that static_graph promised is fixed.
          auto job = loom::build(loom::model<branchy>() | loom::seeded(3) | loom::ddp({.static_graph = true}), world());
          auto x = torch::randn({4, 8});
          for (int step = 0; step < 4; ++step) job.backward(job.forward(x, step != 2 || !last_rank()).square().mean());
        },
        "parameter 'extra.(weight|bias)' received no gradient on rank \\d in step 3, but one in the step that "
        "recorded the graph; under ddp\\(\\{.static_graph = true\\}\\) every step must use the same parameters"}},
      {"static-graph-starts-using",
       {[] {
          // The last rank leaves `extra` out of the recording step, then uses it.
          auto job = loom::build(loom::model<branchy>() | loom::seeded(3) |
                                     loom::ddp({.find_unused_parameters = true, .static_graph = true}),
                                 world());
          auto x = torch::randn({4, 8});
          for (int step = 0; step < 3; ++step) job.backward(job.forward(x, step != 0 || !last_rank()).square().mean());
        },
        "parameter 'extra.(weight|bias)' received a gradient on rank \\d in step 2, but none in the step that "
        "recorded the graph; under ddp\\(\\{.static_graph = true\\}\\) every step must use the same parameters"}},
      {"last-rank-killed-in-backward",
       {[] { killed_in_backward(world().world_size() - 1); },
        // Rank 0, which hosts the store, always names the lost rank (peer_death.py checks that); a rank that
        // noticed only after rank 0 had left finds the store gone with it, and says so.
        "rank \\d's backward pass failed(: rank \\d fell silent \\(no heartbeat in the rendezvous store|, and the "
        "rendezvous store is unreachable: rank 0, which hosts it, is gone)"}},
      {"rank0-killed-in-backward",
       {[] { killed_in_backward(0); },
        "rank \\d's backward pass failed, and the rendezvous store is unreachable: rank 0, which hosts it, is gone"}},
      {"waiting-on-a-failed-rank",
       {waiting_on_a_failed_rank,
        "rank \\d's all-reduce failed: rank 1 fell silent|rank 1 fell silent.*; then rank "
        "\\d's all-reduce failed"}},
      {"fsdp-unit-skipped",
       {[] { misuse_units(/*bypass=*/false); },
        "fsdp\\(\\): unit 'blocks.2' ran its forward where the schedule has unit 'blocks.1' next, entry #2 "
        "\\(all_gather forward, \\d+ B: blocks.1.scale ... blocks.1.down.bias\\); this rank would have waited on "
        "entry #3 \\(all_gather forward, \\d+ B: blocks.2.scale ... blocks.2.down.bias\\) instead. Every rank must "
        "run every unit"}},
      {"fsdp-unit-bypassed",
       {[] { misuse_units(/*bypass=*/true); },
        "fsdp\\(\\): unit 'blocks.1' was used without being entered through loom::nn::Unit"}},
      {"fsdp-branches-differ",
       {[] {
          auto job = loom::build(loom::model<TwoExperts>() | loom::seeded(3) | loom::fsdp(), world());
          const auto expert = last_rank() ? loom::noise_expert::low_noise : loom::noise_expert::high_noise;
          job.backward(job.forward(torch::randn({4, loom::testing::width}), expert).square().mean());
        },
        "fsdp\\(\\): the ranks took different branches of the model in this pass \\(rank 0 'high', .*rank \\d "
        "'low'\\): every rank must take the same branch in a pass"}},
      {"fsdp-two-branches-a-pass",
       {[] {
          auto job = loom::build(loom::model<TwoExperts>() | loom::seeded(3) | loom::fsdp(), world());
          job.backward(job.forward(torch::randn({4, loom::testing::width}), /*both_experts=*/true).square().mean());
        },
        "fsdp\\(\\): the pass entered branch 'low' after branch 'high': a pass takes at most one branch of the "
        "model"}},
      {"fsdp-units-differ",
       {[] { auto job = loom::build(loom::model<units_on_some_ranks>() | loom::seeded(3) | loom::fsdp(), world()); },
        "the ranks' collective schedules differ.*first difference at entry #0: rank 0 has 'all_gather forward world"}},
      {"tensor-parallel-wrong-order",
       {[] {
          auto job = loom::build(loom::model<swapped_mlps>() | loom::seeded(3) | loom::tensor_parallel(2) | loom::ddp(),
                                 world());
          job.backward(job.forward(torch::randn({4, 8})).square().mean());
        },
        "tensor_parallel: the model issued down_b's partial output \\(all_reduce forward\\) where the schedule has "
        "down_a's partial output \\(all_reduce forward\\)"}},
      {"tensor-parallel-different-split",
       {[] {
          auto job = loom::build(loom::model<swapped_mlps>(/*split_otherwise=*/true) | loom::seeded(3) |
                                     loom::tensor_parallel(2) | loom::ddp(),
                                 world());
        },
        // At 2 ranks the first difference is the tensor group's sum; at 4, the data-parallel ranks' gradient
        // buckets, which hold the slices, come first.
        "the ranks' collective schedules differ.*first difference at entry #\\d+: rank 0 has '.*down_b"}},
      {"user-error-in-forward-ddp", {[] { user_error_in_forward(loom::ddp()); }, user_error}},
      {"user-error-in-forward-fsdp", {[] { user_error_in_forward(loom::fsdp()); }, user_error}},
      {"unused-without-option",
       {[] {
          auto job = loom::build(loom::model<branchy>() | loom::seeded(3) | loom::ddp(), world());
          auto x = torch::randn({4, 8});
          job.backward(job.forward(x, !last_rank()).square().mean());
          job.backward(job.forward(x, !last_rank()).square().mean());
        },
        "parameter 'extra.(weight|bias)' received no gradient on rank \\d in this step.*"
        "find_unused_parameters = true"}},
  };
  return all;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 || !scenarios().contains(argv[1])) {
    std::cerr << "usage: dist-failures MODE (one of the scenarios in failures.cpp)\n";
    return 2;
  }
  const auto& [run, expected] = scenarios().at(argv[1]);
  (void)world();
  const auto start = std::chrono::steady_clock::now();
  try {
    run();
  } catch (const std::exception& error) {
    const auto seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string message = error.what();
    const bool matches = std::regex_search(message, std::regex(expected));
    std::cout << (matches ? "expected" : "UNEXPECTED") << " failure after " << seconds << " s: " << message << '\n';
    if (!matches) std::cout << "expected a message matching: " << expected << '\n';
    std::cout.flush();
    // peer_death.py's survivors live on after their error, as a program that caught it would.
    if (const char* linger = std::getenv("LOOM_TEST_LINGER_S"))
      std::this_thread::sleep_for(std::chrono::seconds(std::atoi(linger)));
    return matches && seconds < 10 ? 0 : 1;
  }
  std::cout << "UNEXPECTED: " << argv[1] << " did not fail\n";
  return 1;
}

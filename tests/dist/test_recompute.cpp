// recompute(...) across real processes, at 1, 2 and 3 ranks, for both model forms: the gradients of
// every step equal the plain run's, exactly, under local(), ddp() and fsdp(), with dropout in every
// unit (and in LoRA's adapters), under mixed precision, with no_sync accumulation and with a rank
// that skips a unit; nothing renamed (state_dict, weights and adapter files byte for byte); fsdp()'s
// schedule unchanged; the activations a step holds measured; and the errors a user meets.
#include "heap.hpp"
#include "world.hpp"

#include <loom/loom.hpp>

#include <torch/optim/sgd.h>
#include <torch/torch.h>

#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

using Catch::Matchers::ContainsSubstring;
using loom::testing::heap_in_use;
using loom::testing::shared_scratch;
using loom::testing::world;

namespace {

namespace fs = std::filesystem;

constexpr std::int64_t width = 16;
constexpr double dropout = 0.25;

// A pre-norm residual block with dropout after each layer; the rate is a plain argument, so the
// recomputation passes a value as well as a tensor.
struct dropout_block : torch::nn::Module {
  dropout_block()
      : ln(register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        fc_in(register_module("fc_in", loom::nn::Linear(width, 2 * width))),
        fc_out(register_module("fc_out", loom::nn::Linear(2 * width, width))) {}

  at::Tensor forward(const at::Tensor& x, double rate) {
    const at::Tensor h = torch::dropout(torch::gelu(fc_in(ln(x))), rate, is_training());
    return x + torch::dropout(fc_out(h), rate, is_training());
  }

  torch::nn::LayerNorm ln;
  loom::nn::Linear fc_in, fc_out;
};

struct StackImpl : torch::nn::Module {
  using Block = loom::nn::Unit<dropout_block>;
  static constexpr int units = 4;

  StackImpl()
      : in(register_module("in", loom::nn::Linear(6, width))),
        blocks(register_module("blocks", torch::nn::ModuleList())),
        out(register_module("out", loom::nn::Linear(width, 3))) {
    for (int i = 0; i < units; ++i) blocks->push_back(std::make_shared<Block>());
  }

  // `skip`: a unit left out of this forward (none when outside 0..units-1).
  at::Tensor forward(const at::Tensor& x, int skip = -1) {
    at::Tensor h = in(x);
    for (int i = 0; i < units; ++i) {
      if (i != skip) h = blocks[static_cast<std::size_t>(i)]->as<Block>()->forward(h, dropout);
    }
    return out(h);
  }

  loom::nn::Linear in;
  torch::nn::ModuleList blocks;
  loom::nn::Linear out;
};
TORCH_MODULE(Stack);                  // the holder form
struct SubclassStack : StackImpl {};  // the subclass form

// This rank's batch of `step`: another on every rank and at every step.
std::pair<at::Tensor, at::Tensor> batch(int step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100 * static_cast<std::uint64_t>(step) +
                                                      static_cast<std::uint64_t>(world().rank()));
  return {torch::randn({8, 6}, gen), torch::randn({8, 3}, gen)};
}

// The unit this rank skips at `step`, or none (-1): it changes per rank and per step.
int skipped_unit(int step) { return (step + world().rank()) % (StackImpl::units + 1) - 1; }

constexpr auto adapted = loom::lora(2, {"fc_in", "fc_out"}, {.dropout = 0.1});

// Whether `a` equals `b` exactly (tolerance 0), or within `tolerance` of b's largest magnitude.
bool same(const at::Tensor& a, const at::Tensor& b, double tolerance) {
  if (tolerance == 0) return torch::equal(a, b);
  return (a - b).abs().max().item<double>() <= tolerance * b.abs().max().item<double>();
}

// Under ddp() at 3 ranks and more, gradients equal within float rounding: the Reducer rebuilds its
// buckets after the first step in the order the gradients became ready, which recompute changes
// within a unit (its parameters' gradients arrive together, from the replay), and Gloo's ring sums
// each element in an order that depends on where it sits in its bucket. Two ranks' sums, a + b, do
// not depend on the order.
template <class Strategy>
double reduction_tolerance() {
  return std::is_same_v<Strategy, loom::ddp_stage> && world().world_size() > 2 ? 1e-5 : 0;
}

// Five SGD steps of each job on the same batches and dropout seeds; every loss and every gradient
// (fsdp(): this rank's shards') must be equal, bit for bit, or within `tolerance` (above). With
// `micro_batches` > 1, all but the last backward run under no_sync.
template <class Plain, class Recomputed>
void check_same_steps(Plain& plain, Recomputed& recomputed, bool skipping, int micro_batches = 1,
                      double tolerance = 0) {
  torch::optim::SGD plain_optimizer(plain.trainable_parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::optim::SGD recomputed_optimizer(recomputed.trainable_parameters(),
                                         torch::optim::SGDOptions(0.05).momentum(0.9));
  for (int step = 0; step < 5; ++step) {
    CAPTURE(step);
    const auto run = [&](auto& job) {
      at::Tensor total;
      for (int micro = 0; micro < micro_batches; ++micro) {
        const auto [x, y] = batch(10 * step + micro);
        torch::manual_seed(static_cast<std::uint64_t>(1000 * step + 10 * micro + world().rank()));
        const at::Tensor loss = torch::mse_loss(job.forward(x, skipping ? skipped_unit(step) : -1), y);
        if (micro + 1 < micro_batches) {
          auto no_sync = job.no_sync();
          job.backward(loss);
        } else {
          job.backward(loss);
        }
        total = total.defined() ? total + loss.detach() : loss.detach();
      }
      return total;
    };
    CHECK(same(run(recomputed), run(plain), tolerance));
    const std::vector<at::Tensor> a = plain.trainable_parameters();
    const std::vector<at::Tensor> b = recomputed.trainable_parameters();
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      CAPTURE(i);
      REQUIRE(a[i].grad().defined() == b[i].grad().defined());
      if (a[i].grad().defined()) CHECK(same(b[i].grad(), a[i].grad(), tolerance));
    }
    plain_optimizer.step();
    recomputed_optimizer.step();
    plain.zero_grad();
    recomputed.zero_grad();
  }
}

template <class M, class Stages, class Strategy>
void check_strategy(const Stages& stages, const Strategy& strategy, bool skipping = false, int micro_batches = 1) {
  auto plain = loom::build(loom::model<M>() | stages | strategy, world());
  auto recomputed = loom::build(loom::model<M>() | stages | loom::recompute() | strategy, world());
  const bool order_free = skipping;  // find_unused_parameters: the buckets are never rebuilt
  check_same_steps(plain, recomputed, skipping, micro_batches, order_free ? 0 : reduction_tolerance<Strategy>());
}

}  // namespace

TEMPLATE_TEST_CASE("with recompute every step's gradients equal the plain run's, with dropout, under every strategy",
                   "[recompute]", Stack, SubclassStack) {
  const std::string variant =
      GENERATE("local", "ddp", "fsdp", "lora-ddp", "lora-fsdp", "bf16-ddp", "bf16-fsdp", "lora-bf16-fsdp",
               "fsdp-whole-after-forward", "ddp-no-sync", "fsdp-no-sync", "ddp-skipping-a-unit");
  if ((variant == "local") == world().is_distributed()) return;  // local() is the 1-rank case
  CAPTURE(variant);
  constexpr auto seeded = loom::seeded(3);
  if (variant == "local") check_strategy<TestType>(seeded, loom::local());
  if (variant == "ddp") check_strategy<TestType>(seeded, loom::ddp());
  if (variant == "fsdp") check_strategy<TestType>(seeded, loom::fsdp());
  if (variant == "lora-ddp") check_strategy<TestType>(seeded | adapted, loom::ddp());
  if (variant == "lora-fsdp") check_strategy<TestType>(seeded | adapted, loom::fsdp());
  if (variant == "bf16-ddp") check_strategy<TestType>(seeded | loom::mixed_precision(), loom::ddp());
  if (variant == "bf16-fsdp") check_strategy<TestType>(seeded | loom::mixed_precision(), loom::fsdp());
  if (variant == "lora-bf16-fsdp") {
    check_strategy<TestType>(seeded | loom::default_dtype(loom::bf16) | adapted | loom::mixed_precision(),
                             loom::fsdp());
  }
  if (variant == "fsdp-whole-after-forward") {
    check_strategy<TestType>(seeded, loom::fsdp({.reshard_after_forward = false}));
  }
  if (variant == "ddp-no-sync") check_strategy<TestType>(seeded, loom::ddp(), false, 3);
  if (variant == "fsdp-no-sync") check_strategy<TestType>(seeded | adapted, loom::fsdp(), false, 3);
  if (variant == "ddp-skipping-a-unit") {
    check_strategy<TestType>(seeded, loom::ddp({.find_unused_parameters = true}), true);
  }
}

namespace {

std::string bytes_of(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Every file under `folder`, by its path relative to it, with its bytes.
std::map<std::string, std::string> files_in(const fs::path& folder) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(folder)) {
    if (entry.is_regular_file()) files[fs::relative(entry.path(), folder).string()] = bytes_of(entry.path());
  }
  return files;
}

template <class M>
std::vector<std::string> parameter_names(M& model) {
  if constexpr (loom::detail::module_holder<M>) {
    return model->named_parameters().keys();
  } else {
    return model.named_parameters().keys();
  }
}

// Two steps, the second on ddp()'s rebuilt buckets when the world is small enough that the sums do
// not depend on the buckets' order (reduction_tolerance); one step otherwise, so that the files
// compared byte for byte hold the same values.
template <class Job>
void train_steps(Job& job) {
  torch::optim::SGD optimizer(job.trainable_parameters(), torch::optim::SGDOptions(0.05));
  const int steps = world().world_size() > 2 ? 1 : 2;
  for (int step = 0; step < steps; ++step) {
    const auto [x, y] = batch(step);
    torch::manual_seed(static_cast<std::uint64_t>(step));
    job.backward(torch::mse_loss(job.forward(x), y));
    optimizer.step();
    job.zero_grad();
  }
}

template <class Job>
void save_all(Job& job, const fs::path& folder) {
  job.save_weights(folder / "weights");
  job.save_adapter(folder / "adapter");
  job.save_weights(folder / "sharded", /*max_shard_bytes=*/2048);
}

}  // namespace

TEMPLATE_TEST_CASE("recompute renames nothing: the same names, state_dict, weight and adapter files, byte for byte",
                   "[recompute][names]", Stack, SubclassStack) {
  const bool sharded = GENERATE(false, true);
  CAPTURE(sharded);
  const auto compare = [&](auto& plain, auto& recomputed) {
    CHECK(parameter_names(plain.module()) == parameter_names(recomputed.module()));
    train_steps(plain);
    train_steps(recomputed);
    const loom::tensor_state a = plain.state_dict();
    const loom::tensor_state b = recomputed.state_dict();
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      CHECK(a[i].name == b[i].name);
      CHECK(torch::equal(a[i].tensor, b[i].tensor));
    }
    const fs::path folder = shared_scratch("recompute", std::string(sharded ? "fsdp" : "ddp") + "-files");
    if (world().rank() == 0) {
      save_all(plain, folder / "plain");
      save_all(recomputed, folder / "recomputed");
    } else {
      save_all(plain, folder / "plain-elsewhere");
      save_all(recomputed, folder / "recomputed-elsewhere");
    }
    world().comm().barrier().wait();
    const auto plain_files = files_in(folder / "plain");
    CHECK(plain_files.size() >= 3);
    CHECK(plain_files == files_in(folder / "recomputed"));
  };
  constexpr auto base = loom::model<TestType>() | loom::seeded(8) | adapted;
  if (sharded) {
    auto plain = loom::build(base | loom::fsdp(), world());
    auto recomputed = loom::build(base | loom::recompute() | loom::fsdp(), world());
    compare(plain, recomputed);
  } else {
    auto plain = loom::build(base | loom::ddp(), world());
    auto recomputed = loom::build(base | loom::recompute() | loom::ddp(), world());
    compare(plain, recomputed);
  }
}

TEST_CASE("describe() names the units that recompute; fsdp()'s schedule is the plain one", "[recompute][describe]") {
  constexpr auto base = loom::model<Stack>() | loom::seeded(3);
  auto every_second = loom::build(base | loom::recompute({.every = 2}) | loom::fsdp(), world());
  CHECK_THAT(every_second.describe(), ContainsSubstring("recompute(every=2)"));
  CHECK_THAT(every_second.describe(), ContainsSubstring("build: recompute: 2 units in backward: blocks.1, blocks.3"));
  auto plain = loom::build(base | loom::fsdp(), world());
  // The recomputation's gathers are the backward gathers a resharded unit has anyway.
  CHECK(every_second.schedule().fingerprint() == plain.schedule().fingerprint());
  check_same_steps(plain, every_second, false);
  auto all = loom::build(base | loom::recompute() | loom::ddp(), world());
  CHECK_THAT(all.describe(), ContainsSubstring("build: recompute: 4 units in backward: blocks.0, blocks.1, blocks.2, "
                                               "blocks.3"));
}

namespace {

struct no_units : torch::nn::Module {
  no_units() : layer(register_module("layer", loom::nn::Linear(6, 3))) {}
  at::Tensor forward(const at::Tensor& x) { return layer(x); }
  loom::nn::Linear layer;
};

// A unit whose forward returns what a recomputation cannot hand back to autograd.
struct pair_block : torch::nn::Module {
  pair_block() : layer(register_module("layer", loom::nn::Linear(6, 6))) {}
  std::vector<at::Tensor> forward(const at::Tensor& x) { return {layer(x), x}; }
  loom::nn::Linear layer;
};
struct returns_a_vector : torch::nn::Module {
  returns_a_vector() : unit(register_module("unit", std::make_shared<loom::nn::Unit<pair_block>>())) {}
  at::Tensor forward(const at::Tensor& x) { return unit->forward(x).front(); }
  std::shared_ptr<loom::nn::Unit<pair_block>> unit;
};

}  // namespace

TEST_CASE("recompute without a unit, choosing none, or on a unit it cannot replay says what to do",
          "[recompute][errors]") {
  CHECK_THROWS_WITH(loom::build(loom::model<no_units>() | loom::recompute() | loom::ddp(), world()),
                    ContainsSubstring("recompute(): the model has no loom::nn::Unit, so no block can be recomputed: "
                                      "hold each block as loom::nn::Unit<Block>"));
  CHECK_THROWS_WITH(loom::build(loom::model<Stack>() | loom::recompute({.every = 5}) | loom::ddp(), world()),
                    ContainsSubstring("recompute({.every = 5}) chooses none of the model's 4 units: pass .every = 4 "
                                      "or less"));
  auto job = loom::build(loom::model<returns_a_vector>() | loom::seeded(1) | loom::recompute() | loom::ddp(), world());
  CHECK_THROWS_WITH(job.forward(torch::ones({2, 6})),
                    ContainsSubstring("cannot be recomputed: its forward must take tensors"));
}

namespace {

// The bytes a step holds between its forward and its backward: what autograd saved for backward.
template <class Job>
std::int64_t activation_bytes(Job& job, const at::Tensor& x) {
  const std::int64_t before = heap_in_use();
  const at::Tensor loss = job.forward(x).square().mean();
  const std::int64_t held = heap_in_use() - before;
  job.backward(loss);
  job.zero_grad();
  return held;
}

}  // namespace

TEST_CASE("recompute holds about one unit's activations and the units' inputs, not every unit's",
          "[recompute][memory]") {
  constexpr auto base = loom::model<Stack>() | loom::seeded(3);
  auto plain = loom::build(base | loom::ddp(), world());
  auto recomputed = loom::build(base | loom::recompute() | loom::ddp(), world());
  auto second = loom::build(base | loom::recompute({.every = 2}) | loom::ddp(), world());
  const at::Tensor x = torch::randn({4096, 6});
  (void)activation_bytes(plain, x);  // the allocator's first touches, out of the way
  const std::int64_t plain_bytes = activation_bytes(plain, x);
  const std::int64_t recomputed_bytes = activation_bytes(recomputed, x);
  const std::int64_t second_bytes = activation_bytes(second, x);
  // A unit keeps about 9 activations of x's rows (its input, norm, two of fc_in's width with the
  // dropout masks, and fc_out's): 4 units about 36 rows of `width` floats, recomputed ones only
  // their inputs (1 each).
  const std::int64_t row_bytes = 4096 * width * 4;
  INFO("plain " << plain_bytes << ", every unit " << recomputed_bytes << ", every second " << second_bytes
                << ", one activation " << row_bytes);
  CHECK(plain_bytes > 20 * row_bytes);
  CHECK(recomputed_bytes < plain_bytes / 3);
  CHECK(recomputed_bytes >= 4 * row_bytes);  // the units' inputs are kept
  CHECK(second_bytes < plain_bytes);
  CHECK(second_bytes > recomputed_bytes);
}

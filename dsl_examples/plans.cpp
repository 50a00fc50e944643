// loom's plan DSL on its own: compose plans, print them, check plans assembled at run time.
// No LibTorch here; a recipe per stage, each a plan you could hand to loom::build.
#include "common/command_line.hpp"

#include <loom/dsl.hpp>

#include <CLI/CLI.hpp>

#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace recipes {

// Stands in for a LibTorch module: the DSL accepts any class and stores its constructor arguments.
struct gpt_config {
  int layers = 4;
  int width = 256;
};

struct TinyGpt {
  explicit TinyGpt(gpt_config) {}
};

// model<M>(args...): the only required stage. No strategy means local().
constexpr auto model_only = loom::model<TinyGpt>(gpt_config{.layers = 2});

// seeded(s): identical replicas on every rank without a broadcast.
constexpr auto seeded = loom::model<TinyGpt>(gpt_config{}) | loom::seeded(42);

// lora(rank): adapters on loom::default_targets, alpha = rank.
constexpr auto lora_defaults = loom::model<TinyGpt>(gpt_config{}) | loom::seeded(42) | loom::lora(8);

// lora(rank, targets, options): names, a regex, a fractional alpha, dropout, exclusions.
constexpr auto lora_tuned = loom::model<TinyGpt>(gpt_config{}) | loom::seeded(42) |
                            loom::lora(16, {"q_proj", "v_proj", loom::pattern(R"(blocks\.\d+\.mlp\.fc1)")},
                                       {.alpha = 8.5, .dropout = 0.05, .exclude = {"blocks.0.attn.q_proj"}});

// trainable(patterns): train the norms and the head next to the adapters.
constexpr auto lora_and_norms = loom::model<TinyGpt>(gpt_config{}) | loom::seeded(42) |
                                loom::lora(8, {"q_proj", "v_proj"}) | loom::trainable({"norm", "lm_head"});

// ddp(options): data parallel, options named as PyTorch names them.
constexpr auto data_parallel = loom::model<TinyGpt>(gpt_config{}) | loom::seeded(42) | loom::lora(8) |
                               loom::ddp({.bucket_cap_mb = 50, .static_graph = true});

// fsdp(options): sharded parameters; LoRA adapters over the frozen base are replicated.
constexpr auto sharded = loom::model<TinyGpt>(gpt_config{.layers = 24}) | loom::seeded(42) | loom::lora(16) |
                         loom::fsdp({.reshard_after_forward = false});

// default_dtype and mixed_precision: the frozen base built in bf16, forward and backward in bf16,
// the fp32 shards and adapters stepped, gradients reduced in fp32 (docs/precision.md).
constexpr auto bf16 = loom::model<TinyGpt>(gpt_config{}) | loom::seeded(42) | loom::default_dtype(loom::bf16) |
                      loom::lora(8) | loom::mixed_precision({.reduce = loom::fp32}) | loom::fsdp();

// quantized: QLoRA. The frozen base's linear weights held in bitsandbytes' NF4 (docs/quantization.md),
// read from the checkpoint and quantized one weight at a time, sharded by fsdp() as any parameter;
// the adapters over them train in full precision.
const auto qlora = loom::model<TinyGpt>(gpt_config{}) | loom::seeded(42) | loom::default_dtype(loom::bf16) |
                   loom::pretrained("base/") | loom::quantized(loom::nf4) | loom::lora(16) |
                   loom::mixed_precision({.reduce = loom::fp32}) | loom::fsdp();

// recompute: every second block runs its forward again in backward instead of keeping its
// activations (docs/recompute.md); names, files and gradients are those of the plan without it.
constexpr auto deep = loom::model<TinyGpt>(gpt_config{.layers = 48}) | loom::seeded(42) | loom::lora(8) |
                      loom::recompute({.every = 2}) | loom::fsdp();

// tensor_parallel: each layer split across groups of 2 consecutive ranks (Megatron-style), the rest
// of the world data-parallel: rank r reads the batches of loom::data_parallel(plan, r, world).rank.
constexpr auto tensor_split = loom::model<TinyGpt>(gpt_config{.layers = 24}) | loom::seeded(42) |
                              loom::tensor_parallel(2) | loom::lora(8) | loom::fsdp();

// A partial pipeline is a value too: write the adapter setup once, pipe it into several models.
constexpr auto adapters = loom::lora(8, {"q_proj", "v_proj"}) | loom::trainable({"norm"}) | loom::ddp();
constexpr auto small = loom::model<TinyGpt>(gpt_config{.layers = 2}) | loom::seeded(1) | adapters;
constexpr auto large = loom::model<TinyGpt>(gpt_config{.layers = 48}) | loom::seeded(1) | adapters;

// A user-written strategy: a type that models loom::Strategy. This one averages gradients only every
// `period` steps; the hooks get their context (module, process group, schedule) from the runtime.
struct every_nth_step {
  static constexpr std::string_view name = "every_nth_step";
  int period = 4;
  int step = 0;

  std::string options() const { return "period=" + std::to_string(period); }
  void setup(loom::strategy_context&) { step = 0; }
  void before_forward(loom::strategy_context&) {}
  void after_backward(loom::strategy_context&) { step = (step + 1) % period; }
};
static_assert(loom::Strategy<every_nth_step>);

const auto custom =
    loom::model<TinyGpt>(gpt_config{}) | loom::seeded(42) | loom::lora(8) | loom::strategy(every_nth_step{.period = 8});

}  // namespace recipes

namespace {

void print(std::string_view title, const auto& plan) { std::cout << "# " << title << '\n' << plan.describe() << '\n'; }

// A plan read at run time (say, from a config file): the same rules, the same sentences, as an
// exception instead of a compile error.
void check_at_run_time(const std::vector<loom::stage_kind>& stages) {
  std::string spelled;
  for (loom::stage_kind kind : stages) spelled += std::string(loom::name_of(kind)) + " ";
  try {
    loom::check_stages(stages);
    std::cout << spelled << "-> ok\n";
  } catch (const loom::plan_error& error) {
    std::cout << spelled << "-> " << error.what() << '\n';
  }
}

}  // namespace

int main(int argc, char** argv) {
  int rank = 0;
  CLI::App app{"Prints a plan for each of loom's stages, then checks plans assembled at run time.", "plans"};
  app.add_option("rank", rank,
                 "the LoRA rank of a plan built at run time, checked as a run file's is (the default, 0, shows "
                 "the sentence that refuses it)");
  if (const std::optional<int> exit_code = recipes::parse_command_line(app, argc, argv)) return *exit_code;

  print("model only", recipes::model_only);
  print("seeded", recipes::seeded);
  print("lora with defaults", recipes::lora_defaults);
  print("lora, tuned", recipes::lora_tuned);
  print("lora and norms", recipes::lora_and_norms);
  print("ddp", recipes::data_parallel);
  print("fsdp", recipes::sharded);
  print("bf16", recipes::bf16);
  print("quantized (QLoRA)", recipes::qlora);
  print("recompute", recipes::deep);
  print("tensor_parallel", recipes::tensor_split);
  print("a reusable closure", recipes::adapters);
  print("... piped into a small model", recipes::small);
  print("... and into a large one", recipes::large);
  print("a user-written strategy", recipes::custom);

  // Values known only at run time go through checked(): the checks of lora(...), as plan_error.
  try {
    const auto plan = loom::model<recipes::TinyGpt>(recipes::gpt_config{}) | loom::lora_stage::checked(rank);
    print("lora with a run-time rank", plan);
  } catch (const loom::plan_error& error) {
    std::cout << "# lora with a run-time rank of " << rank << "\n" << error.what() << "\n\n";
  }

  using enum loom::stage_kind;
  check_at_run_time({model, seeded, lora, ddp});
  check_at_run_time({model, ddp, lora});
  check_at_run_time({model, lora, seeded});
  check_at_run_time({lora, fsdp});
}

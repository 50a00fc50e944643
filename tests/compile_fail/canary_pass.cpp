// expect: pass
// Every stage, composed as a constexpr plan and as a closure: if this does not compile, no other case
// means anything.
#include <loom/dsl.hpp>

#include <string>
#include <string_view>

struct Model {
  explicit Model(int width) : width(width) {}
  int width;
};

struct my_strategy {
  static constexpr std::string_view name = "mine";
  std::string options() const { return {}; }
  void setup(loom::strategy_context&) {}
  void before_forward(loom::strategy_context&) {}
  void after_backward(loom::strategy_context&) {}
};

constexpr auto adapters = loom::lora(16, {"q_proj", loom::pattern("blocks\\.[0-9]+\\.mlp")},
                                     {.alpha = 32, .dropout = 0.05, .exclude = {"lm_head"}}) |
                          loom::trainable({"norm"});

constexpr auto with_ddp =
    loom::model<Model>(64) | loom::seeded(42) | adapters | loom::ddp({.bucket_cap_mb = 50, .static_graph = true});
static_assert(with_ddp.find<loom::lora_stage>()->scaling() == 2.0);

constexpr auto with_fsdp = loom::model<Model>(64) | loom::lora(8) | loom::fsdp({.reshard_after_forward = false});
constexpr auto with_local = loom::model<Model>(64) | loom::local();

std::string describe_all() {
  const auto custom = loom::model<Model>(64) | loom::strategy(my_strategy{});
  return with_ddp.describe() + with_fsdp.describe() + with_local.describe() + custom.describe();
}

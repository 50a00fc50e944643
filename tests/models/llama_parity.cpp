// loom's Llama on a transformers checkpoint (tests/models/llama_vs_transformers.py makes them):
//   llama-parity FOLDER {local|ddp|fsdp}
// reads FOLDER/config.json, builds the plan with pretrained(FOLDER) (the weights by name, strictly),
// runs the forward on FOLDER/expected.safetensors' ids and compares its logits with transformers', on
// every rank.
#include <loom/io/safetensors.hpp>
#include <loom/loom.hpp>
#include <loom/models/llama.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <string_view>
#include <vector>

namespace {

constexpr double tolerance = 1e-5;

template <class Plan>
bool matches(const Plan& plan, const std::filesystem::path& folder, std::string_view strategy_name) {
  auto job = loom::build(plan, loom::runtime::from_env());
  const std::vector<loom::named_tensor> expected = loom::load_safetensors(folder / "expected.safetensors").tensors;
  const auto named = [&](std::string_view name) {
    return std::find_if(expected.begin(), expected.end(), [&](const loom::named_tensor& t) { return t.name == name; })
        ->tensor;
  };
  const at::Tensor reference = named("logits");
  at::Tensor logits;
  {
    torch::NoGradGuard no_grad;
    logits = job.forward(named("ids"));
  }
  const double scale = reference.abs().max().item<double>();
  const double difference = (logits - reference).abs().max().item<double>();
  const bool same_shape = logits.sizes() == reference.sizes();
  const bool within = same_shape && difference <= tolerance * scale;
  fmt::print("rank {}: {} {}: logits {} against transformers' {}, largest difference {:.2e} of {:.2e}: {}\n",
             job.rt().rank(), folder.filename().string(), strategy_name, fmt::join(logits.sizes(), "x"),
             fmt::join(reference.sizes(), "x"), difference, scale, within ? "within 1e-5" : "BEYOND 1e-5");
  return within;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    fmt::print(stderr, "usage: llama-parity FOLDER {{local|ddp|fsdp}}\n");
    return 2;
  }
  const std::filesystem::path folder = argv[1];
  const std::string_view strategy = argv[2];
  try {
    const auto config = loom::models::llama_config::from_pretrained(folder);
    const auto base = loom::model<loom::models::Llama>(config) | loom::seeded(0) | loom::pretrained(folder.string());
    bool ok = false;
    if (strategy == "local") {
      ok = matches(base | loom::local(), folder, strategy);
    } else if (strategy == "ddp") {
      ok = matches(base | loom::ddp(), folder, strategy);
    } else if (strategy == "fsdp") {
      ok = matches(base | loom::fsdp(), folder, strategy);
    } else {
      fmt::print(stderr, "llama-parity: unknown strategy '{}'\n", strategy);
      return 2;
    }
    return ok ? 0 : 1;
  } catch (const std::exception& error) {
    fmt::print(stderr, "llama-parity: {}\n", error.what());
    return 1;
  }
}

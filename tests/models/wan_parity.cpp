// loom's Wan on a diffusers checkpoint (tests/models/wan_vs_diffusers.py makes them and checks what
// this prints):
//   wan-parity FOLDER {local|ddp|fsdp}
// reads FOLDER/config.json, builds the plan with pretrained(FOLDER) (diffusers' weights by name,
// strictly), runs the forward on FOLDER/expected.safetensors' latents, timestep and text, and
// compares the velocity with diffusers' on every rank: within 1e-5 of its largest magnitude.
#include <loom/io/safetensors.hpp>
#include <loom/loom.hpp>
#include <loom/models/wan.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <limits>
#include <string_view>
#include <vector>

namespace {

namespace fs = std::filesystem;

constexpr double fp32_tolerance = 1e-5;

struct arguments {
  fs::path folder;
  std::string_view strategy;
};

at::Tensor named(const std::vector<loom::named_tensor>& tensors, std::string_view name) {
  const auto found =
      std::find_if(tensors.begin(), tensors.end(), [&](const loom::named_tensor& t) { return t.name == name; });
  if (found == tensors.end()) throw std::runtime_error(fmt::format("expected.safetensors has no '{}'", name));
  return found->tensor;
}

// describe()'s line of what pretrained(...) read on this rank (the driver checks that under fsdp() a
// rank reads its share of the checkpoint, under the others all of it).
void print_bytes_read(auto& job) {
  const std::string described = job.describe();
  const auto begin = described.find("weights from");
  fmt::print("rank {}: {}\n", job.rt().rank(), described.substr(begin, described.find('\n', begin) - begin));
}

template <class Plan>
bool compare(const Plan& plan, const arguments& args) {
  auto job = loom::build(plan, loom::runtime::from_env());
  print_bytes_read(job);
  const std::vector<loom::named_tensor> expected = loom::load_safetensors(args.folder / "expected.safetensors").tensors;
  const at::Tensor reference = named(expected, "output");
  at::Tensor output;
  {
    torch::NoGradGuard no_grad;
    output = job.forward(named(expected, "latents"), named(expected, "timestep"), named(expected, "text"));
  }
  const double scale = reference.abs().max().item<double>();
  const bool same_shape = output.sizes() == reference.sizes();
  const double difference =
      same_shape ? (output - reference).abs().max().item<double>() : std::numeric_limits<double>::infinity();
  const double allowed = fp32_tolerance * scale;
  const bool within = difference <= allowed;
  fmt::print(
      "rank {}: {} {}: velocity {} against diffusers' {}, largest difference {:.2e} (largest value {:.2e}, "
      "{:.2e} of it): {} {:.2e}\n",
      job.rt().rank(), args.folder.filename().string(), args.strategy, fmt::join(output.sizes(), "x"),
      fmt::join(reference.sizes(), "x"), difference, scale, difference / scale, within ? "within" : "BEYOND", allowed);
  return within;
}

template <class Plan>
bool with_strategy(const Plan& plan, const arguments& args) {
  if (args.strategy == "local") return compare(plan | loom::local(), args);
  if (args.strategy == "ddp") return compare(plan | loom::ddp(), args);
  if (args.strategy == "fsdp") return compare(plan | loom::fsdp(), args);
  throw std::invalid_argument(fmt::format("unknown strategy '{}': local, ddp or fsdp", args.strategy));
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string_view> words(argv + 1, argv + argc);
  if (words.size() != 2) {
    fmt::print(stderr, "usage: wan-parity FOLDER {{local|ddp|fsdp}}\n");
    return 2;
  }
  const arguments args{.folder = words[0], .strategy = words[1]};
  try {
    const auto config = loom::models::wan_config::from_pretrained(args.folder);
    const auto plan = loom::model<loom::models::Wan>(config) | loom::seeded(0) | loom::pretrained(args.folder.string());
    return with_strategy(plan, args) ? 0 : 1;
  } catch (const std::exception& error) {
    fmt::print(stderr, "wan-parity: {}\n", error.what());
    return 1;
  }
}

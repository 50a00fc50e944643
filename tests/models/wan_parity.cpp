// loom's Wan on a diffusers checkpoint (tests/models/wan_vs_diffusers.py makes them and checks what
// this prints):
//   wan-parity FOLDER {local|ddp|fsdp|hsdp} [--bf16]
// reads FOLDER/config.json, builds the plan with pretrained(FOLDER) (diffusers' weights by name,
// strictly), runs the forward on FOLDER/expected.safetensors' latents, timestep and text, and
// compares the velocity with diffusers' on every rank: within 1e-5 of its largest magnitude.
// With --bf16 the base is built in bf16 and frozen under lora(4, {to_q, to_k, to_v, to_out.0}) (its
// adapters add nothing until trained), what diffusers keeps in fp32 stays fp32, and the latents and
// text come in bf16, as diffusers' pipeline runs from_pretrained(torch_dtype=torch.bfloat16): the rms
// difference from diffusers' fp32 velocity at most bf16_margin times that of diffusers' own model in
// bf16; the largest difference from that model's velocity is printed beside it.
#include "named_tensor.hpp"

#include <loom/io/safetensors.hpp>
#include <loom/loom.hpp>
#include <loom/models/wan.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <string_view>
#include <vector>

namespace {

using loom::testing::named;

namespace fs = std::filesystem;

constexpr double fp32_tolerance = 1e-5;
// bf16 keeps 8 significant bits and the blocks compound their rounding: what is close enough is
// measured on diffusers' own model in bf16, on the same inputs.
constexpr double bf16_margin = 2;

struct arguments {
  fs::path folder;
  std::string_view strategy;
  bool bf16 = false;
};

double largest_difference(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }
// bf16's errors are compared by their root mean square: the largest of many rounding errors is one
// sample of a wide tail, their mean square is stable from one model to the next.
double rms_difference(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).square().mean().sqrt().item<double>();
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
  const auto input = [&](std::string_view name) {
    const at::Tensor value = named(expected, name);
    return args.bf16 ? value.to(at::kBFloat16) : value;
  };
  at::Tensor output;
  {
    torch::NoGradGuard no_grad;
    output = job.forward(input("latents"), named(expected, "timestep"), input("text")).to(at::kFloat);
  }
  if (output.sizes() != reference.sizes()) {
    fmt::print("rank {}: {} {}: velocity {} against diffusers' {}: BEYOND\n", job.rt().rank(),
               args.folder.filename().string(), args.strategy, fmt::join(output.sizes(), "x"),
               fmt::join(reference.sizes(), "x"));
    return false;
  }
  const double scale = reference.abs().max().item<double>();
  if (args.bf16) {
    const at::Tensor theirs = named(expected, "output_bf16");
    const double difference = rms_difference(output, reference);
    const double allowed = bf16_margin * rms_difference(theirs, reference);
    const bool within = difference <= allowed;
    fmt::print(
        "rank {}: {} {} bf16: velocity {}, rms difference from diffusers' fp32 {:.2e}: {} {:.2e} ({} x diffusers' "
        "own in bf16); largest difference from diffusers' bf16 {:.2e} (largest value {:.2e})\n",
        job.rt().rank(), args.folder.filename().string(), args.strategy, fmt::join(output.sizes(), "x"), difference,
        within ? "within" : "BEYOND", allowed, bf16_margin, largest_difference(output, theirs), scale);
    return within;
  }
  const double difference = largest_difference(output, reference);
  const double allowed = fp32_tolerance * scale;
  const bool within = difference <= allowed;
  fmt::print(
      "rank {}: {} {}: velocity {}, largest difference from diffusers' {:.2e} (largest value {:.2e}, {:.2e} of it): "
      "{} {:.2e}\n",
      job.rt().rank(), args.folder.filename().string(), args.strategy, fmt::join(output.sizes(), "x"), difference,
      scale, difference / scale, within ? "within" : "BEYOND", allowed);
  return within;
}

template <class Plan>
bool with_strategy(const Plan& plan, const arguments& args) {
  if (args.strategy == "local") return compare(plan | loom::local(), args);
  if (args.strategy == "ddp") return compare(plan | loom::ddp(), args);
  if (args.strategy == "fsdp") return compare(plan | loom::fsdp(), args);
  if (args.strategy == "hsdp") return compare(plan | loom::fsdp({.shard_group_size = 2}), args);
  throw std::invalid_argument(fmt::format("unknown strategy '{}': local, ddp, fsdp or hsdp", args.strategy));
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string_view> words(argv + 1, argv + argc);
  if (words.size() < 2 || words.size() > 3 || (words.size() == 3 && words[2] != "--bf16")) {
    fmt::print(stderr, "usage: wan-parity FOLDER {{local|ddp|fsdp|hsdp}} [--bf16]\n");
    return 2;
  }
  const arguments args{.folder = words[0], .strategy = words[1], .bf16 = words.size() == 3};
  try {
    const auto config = loom::models::wan_config::from_pretrained(args.folder);
    const auto base = loom::model<loom::models::Wan>(config) | loom::seeded(0);
    const std::string folder = args.folder.string();
    const bool ok = args.bf16 ? with_strategy(base | loom::default_dtype(loom::bf16) | loom::pretrained(folder) |
                                                  loom::lora(4, {"to_q", "to_k", "to_v", "to_out.0"}),
                                              args)
                              : with_strategy(base | loom::pretrained(folder), args);
    return ok ? 0 : 1;
  } catch (const std::exception& error) {
    fmt::print(stderr, "wan-parity: {}\n", error.what());
    return 1;
  }
}

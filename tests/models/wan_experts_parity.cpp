// loom's WanExperts (Wan 2.2 A14B's two experts) on a diffusers pipeline's folder
// (tests/models/wan_experts_vs_diffusers.py writes it and checks what this prints and writes):
//   wan-experts-parity PIPELINE {local|fsdp}   each case's velocity against diffusers'
//   wan-experts-parity PIPELINE refusals       ddp() and tensor_parallel(2) refused (2 ranks)
//   wan-experts-parity PIPELINE lora OUT       LoRA on both experts, saved and loaded back
// The model is built with pretrained(PIPELINE): each expert from its component's folder. For each case
// of PIPELINE/expected.safetensors ("timestep/<case>", "output/<case>": the velocity of the transformer
// WanPipeline takes) the velocity chosen by the timestep must equal diffusers' within 1e-5 of its
// largest magnitude, and the explicit expert's ("expert/<case>": 0 high noise, 1 low noise) must equal
// it bit for bit; each "mixed/<case>" (timesteps on both sides of the boundary) must be refused with
// the sentence that says to give the expert.
// lora: lora(4, {to_q, to_k, to_v, to_out.0}, {.alpha = 8}) on both experts, a few SGD steps under
// local(), each on one expert given explicitly; then
//   OUT/diffusers  save_adapter(..., adapter_format::diffusers): transformer/ and transformer_2/
//   OUT/peft       save_adapter(...): PEFT's folder an expert
//   OUT/merged     merge(), then save_pretrained(...): a pipeline's folder, an expert a folder
//   OUT/outputs.safetensors  "adapted/<case>", "merged/<case>": each case's velocity, adapted and merged
// Each saved adapter, loaded into a job built afresh, gives the adapted velocities bit for bit, and the
// merged velocities equal the adapted ones within 1e-5 of their largest magnitude.
#include "named_tensor.hpp"

#include <loom/io/safetensors.hpp>
#include <loom/loom.hpp>
#include <loom/models/wan_experts.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/optim/sgd.h>
#include <torch/torch.h>

#include <exception>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace {

using loom::noise_expert;
using loom::testing::named;

namespace fs = std::filesystem;

constexpr double fp32_tolerance = 1e-5;
constexpr int training_steps = 4;
// What the refusal of timesteps on both sides of the boundary says to do.
constexpr std::string_view give_the_expert = "give the expert explicitly";

struct expected_file {
  std::vector<loom::named_tensor> tensors;

  // The names after `kind` + "/" of the file's tensors.
  [[nodiscard]] std::vector<std::string> cases(std::string_view kind) const {
    const std::string prefix = std::string(kind) + "/";
    std::vector<std::string> found;
    for (const loom::named_tensor& t : tensors) {
      if (t.name.starts_with(prefix)) found.push_back(t.name.substr(prefix.size()));
    }
    return found;
  }
  [[nodiscard]] at::Tensor operator()(std::string_view kind, const std::string& name) const {
    return named(tensors, fmt::format("{}/{}", kind, name));
  }
};

int rank_of(auto& job) { return job.rt().rank(); }

at::Tensor velocity(auto& job, const expected_file& file, const at::Tensor& timestep) {
  torch::NoGradGuard no_grad;
  return job.forward(named(file.tensors, "latents"), timestep, named(file.tensors, "text"));
}

at::Tensor velocity(auto& job, const expected_file& file, const at::Tensor& timestep, noise_expert expert) {
  torch::NoGradGuard no_grad;
  return job.forward(named(file.tensors, "latents"), timestep, named(file.tensors, "text"), expert);
}

bool report(auto& job, const std::string& what, const at::Tensor& output, const at::Tensor& reference, double allowed) {
  const double difference = (output - reference).abs().max().item<double>();
  const bool within = output.sizes() == reference.sizes() && difference <= allowed;
  fmt::print("rank {}: {}: largest difference {:.2e}: {} {:.2e}\n", rank_of(job), what, difference,
             within ? "within" : "BEYOND", allowed);
  return within;
}

// Timesteps on both sides refused, in the sentence that says to give the expert.
bool refuses_mixed(auto& job, const expected_file& file, const std::string& name) {
  try {
    (void)velocity(job, file, file("mixed", name));
  } catch (const std::exception& error) {
    const bool says = std::string_view(error.what()).find(give_the_expert) != std::string_view::npos;
    fmt::print("rank {}: mixed timesteps {}: refused{}: {}\n", rank_of(job), name, says ? "" : " WITHOUT the sentence",
               error.what());
    return says;
  }
  fmt::print("rank {}: mixed timesteps {}: NOT refused\n", rank_of(job), name);
  return false;
}

// describe()'s line of what pretrained(...) read on this rank (the driver checks each rank's share).
void print_bytes_read(auto& job) {
  const std::string described = job.describe();
  const auto begin = described.find("weights from");
  fmt::print("rank {}: {}\n", rank_of(job), described.substr(begin, described.find('\n', begin) - begin));
}

template <class Plan>
bool compare(const Plan& plan, const expected_file& file, std::string_view strategy) {
  auto job = loom::build(plan, loom::runtime::from_env());
  print_bytes_read(job);
  bool ok = true;
  for (const std::string& name : file.cases("timestep")) {
    const at::Tensor timestep = file("timestep", name);
    const at::Tensor reference = file("output", name);
    const at::Tensor chosen = velocity(job, file, timestep);
    ok &= report(job, fmt::format("{} {}: velocity against diffusers'", strategy, name), chosen, reference,
                 fp32_tolerance * reference.abs().max().item<double>());
    const auto expert = static_cast<noise_expert>(file("expert", name).item<std::int64_t>());
    ok &= report(job,
                 fmt::format("{} {}: {} given explicitly against the timestep's choice", strategy, name,
                             loom::to_string(expert)),
                 velocity(job, file, timestep, expert), chosen, 0);
  }
  for (const std::string& name : file.cases("mixed")) ok &= refuses_mixed(job, file, name);
  return ok;
}

// What a model with branches cannot run under: each refused when built, in a sentence.
template <class Plan>
bool refuses(const Plan& plan, std::string_view what) {
  try {
    auto job = loom::build(plan, loom::runtime::from_env());
  } catch (const std::exception& error) {
    fmt::print("{}: refused: {}\n", what, error.what());
    return true;
  }
  fmt::print("{}: NOT refused\n", what);
  return false;
}

// Inputs like the file's, drawn from `seed`, with a timestep on `expert`'s side of the boundary.
struct batch {
  at::Tensor latents, timestep, text, target;
};
batch drawn(const expected_file& file, std::uint64_t seed, noise_expert expert, double boundary) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  const at::Tensor latents = named(file.tensors, "latents");
  const at::Tensor text = named(file.tensors, "text");
  const at::Tensor unit = torch::rand({latents.size(0)}, generator);
  const at::Tensor timestep =
      expert == noise_expert::high_noise ? boundary + unit * (1000 - boundary) : unit * (boundary - 1);
  return {torch::randn(latents.sizes(), generator), timestep, torch::randn(text.sizes(), generator),
          torch::randn(latents.sizes(), generator)};
}

template <class Plan>
bool train_and_save(const Plan& plan, const expected_file& file, const fs::path& out, double boundary) {
  auto job = loom::build(plan, loom::runtime::from_env());
  torch::optim::SGD optimizer(job.trainable_parameters(), torch::optim::SGDOptions(0.5));
  for (int step = 0; step < training_steps; ++step) {
    const noise_expert expert = step % 2 == 0 ? noise_expert::high_noise : noise_expert::low_noise;
    const batch b = drawn(file, 100 + static_cast<std::uint64_t>(step), expert, boundary);
    const at::Tensor predicted = job.forward(b.latents, b.timestep, b.text, expert);
    job.backward((predicted - b.target).square().mean());
    optimizer.step();
    job.zero_grad();
  }
  std::vector<loom::named_tensor> adapted;
  for (const std::string& name : file.cases("timestep")) {
    adapted.push_back({"adapted/" + name, velocity(job, file, file("timestep", name))});
  }
  job.save_adapter(out / "diffusers", loom::adapter_format::diffusers);
  job.save_adapter(out / "peft");

  bool ok = true;
  for (const auto& [folder, format] :
       {std::pair{"diffusers", loom::adapter_format::diffusers}, std::pair{"peft", loom::adapter_format::peft}}) {
    auto reloaded = loom::build(plan, job.rt());
    reloaded.load_adapter(out / folder, format);
    for (const loom::named_tensor& t : adapted) {
      const std::string name = t.name.substr(std::string_view("adapted/").size());
      ok &= report(job, fmt::format("{} loaded back, {}: against the adapted velocity", folder, name),
                   velocity(reloaded, file, file("timestep", name)), t.tensor, 0);
    }
  }
  job.merge();
  std::vector<loom::named_tensor> outputs = adapted;
  for (const loom::named_tensor& t : adapted) {
    const std::string name = t.name.substr(std::string_view("adapted/").size());
    const at::Tensor merged = velocity(job, file, file("timestep", name));
    ok &= report(job, fmt::format("merged, {}: against the adapted velocity", name), merged, t.tensor,
                 fp32_tolerance * t.tensor.abs().max().item<double>());
    outputs.push_back({"merged/" + name, merged});
  }
  job.save_pretrained(out / "merged");
  if (rank_of(job) == 0) loom::save_safetensors(out / "outputs.safetensors", outputs);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string_view> words(argv + 1, argv + argc);
  const bool lora = words.size() == 3 && words[1] == "lora";
  if (words.size() != 2 && !lora) {
    fmt::print(stderr, "usage: wan-experts-parity PIPELINE {{local|fsdp|refusals}} | PIPELINE lora OUT\n");
    return 2;
  }
  const fs::path folder = words[0];
  try {
    const auto config = loom::models::wan_experts_config::from_pretrained(folder);
    const expected_file file{loom::load_safetensors(folder / "expected.safetensors").tensors};
    const auto plan =
        loom::model<loom::models::WanExperts>(config) | loom::seeded(0) | loom::pretrained(folder.string());
    bool ok = false;
    if (lora) {
      ok = train_and_save(plan | loom::lora(4, {"to_q", "to_k", "to_v", "to_out.0"}, {.alpha = 8}) | loom::local(),
                          file, words[2], config.boundary_timestep());
    } else if (words[1] == "local") {
      ok = compare(plan | loom::local(), file, words[1]);
    } else if (words[1] == "fsdp") {
      ok = compare(plan | loom::fsdp(), file, words[1]);
    } else if (words[1] == "refusals") {
      ok = refuses(plan | loom::ddp(), "ddp()");
      ok &= refuses(plan | loom::tensor_parallel(2) | loom::fsdp(), "tensor_parallel(2) | fsdp()");
    } else {
      fmt::print(stderr, "wan-experts-parity: unknown mode '{}': local, fsdp, refusals or lora\n", words[1]);
      return 2;
    }
    return ok ? 0 : 1;
  } catch (const std::exception& error) {
    fmt::print(stderr, "wan-experts-parity: {}\n", error.what());
    return 1;
  }
}

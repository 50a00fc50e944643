// loom::optim::AdamW against torch::optim::AdamW: the same parameters and state, step by step,
// within float rounding, through what varies between steps (gradients, the rate, parameters that
// receive no gradient, parameter groups, layouts, amsgrad), and files that load into either.
#include <loom/io/optimizer_state.hpp>
#include <loom/optim/adamw.hpp>

#include <torch/cuda.h>
#include <torch/serialize.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_exception.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <sstream>
#include <string>
#include <vector>

using Catch::Matchers::ContainsSubstring;

namespace {

// The tolerance: every element within 1e-6 of the reference's largest magnitude.
constexpr double relative_tolerance = 1e-6;
// The second moments' on CUDA, where PyTorch's fused kernel forms 1 - beta2 in float: float(0.999) is
// 0.99900001287, so 1 - beta2 is 1.29e-5 off, and every second moment carries that from the first step
// (torch::optim::AdamW forms it in double). The parameters, through sqrt and the rate, stay within 1e-6.
constexpr double cuda_second_moment_tolerance = 2e-5;

bool close(const at::Tensor& fused, const at::Tensor& reference, double tolerance = relative_tolerance) {
  const double scale = reference.abs().max().item<double>();
  return (fused - reference).abs().max().item<double>() <= tolerance * std::max(scale, 1e-30);
}

// Parameters of the shapes and layouts a model has, on `device`: a weight, a bias, a transposed
// (dense but not contiguous) weight, one in double, and one that every third step leaves without a
// gradient, so that its step count falls behind the others'.
std::vector<at::Tensor> parameters(const at::Device& device) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const auto options = at::TensorOptions().device(device);
  std::vector<at::Tensor> params{
      torch::randn({16, 8}, gen).to(options),     torch::randn({16}, gen).to(options),
      torch::randn({8, 12}, gen).to(options).t(), torch::randn({5, 3}, gen, torch::kDouble).to(options),
      torch::randn({4, 4}, gen).to(options),
  };
  for (at::Tensor& p : params) p.requires_grad_(true);
  return params;
}

std::vector<at::Tensor> clones(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> copies;
  for (const at::Tensor& p : params) copies.push_back(p.detach().clone().requires_grad_(true));
  return copies;
}

// Step `step`'s gradients, the same for both sets: new values each step, none for the last
// parameter every third step, and one gradient laid out unlike its parameter.
void set_gradients(std::vector<at::Tensor>& params, int step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + step);
  for (std::size_t i = 0; i < params.size(); ++i) {
    at::Tensor& p = params[i];
    if (i + 1 == params.size() && step % 3 == 0) {
      p.mutable_grad() = at::Tensor();
      continue;
    }
    at::Tensor grad = torch::randn(p.sizes(), gen, p.scalar_type()).to(p.device());
    if (i == 0) grad = grad.t().contiguous().t();  // column-major where the parameter is row-major
    p.mutable_grad() = grad;
  }
}

template <class Optimizer>
Optimizer make(const std::vector<at::Tensor>& params, bool amsgrad) {
  // Two groups with their own rate and decay, as a recipe that spares biases from decay has.
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{params[0], params[2], params[4]},
                      std::make_unique<torch::optim::AdamWOptions>(
                          torch::optim::AdamWOptions(3e-3).weight_decay(0.1).amsgrad(amsgrad)));
  groups.emplace_back(std::vector<at::Tensor>{params[1], params[3]},
                      std::make_unique<torch::optim::AdamWOptions>(
                          torch::optim::AdamWOptions(1e-3).weight_decay(0.0).betas({0.8, 0.99}).amsgrad(amsgrad)));
  return Optimizer(std::move(groups), torch::optim::AdamWOptions(1e-3).amsgrad(amsgrad));
}

void change_rates(torch::optim::Optimizer& optimizer, int step) {
  for (auto& group : optimizer.param_groups()) {
    auto& options = static_cast<torch::optim::AdamWOptions&>(group.options());
    options.lr(options.lr() * (step % 2 == 0 ? 0.9 : 1.05));
  }
}

void check_same(const torch::optim::Optimizer& fused, const std::vector<at::Tensor>& fused_params,
                const torch::optim::Optimizer& reference, const std::vector<at::Tensor>& reference_params) {
  for (std::size_t i = 0; i < fused_params.size(); ++i) {
    INFO("parameter " << i);
    CHECK(close(fused_params[i].detach(), reference_params[i].detach()));
    const auto& a =
        static_cast<const torch::optim::AdamWParamState&>(*fused.state().at(fused_params[i].unsafeGetTensorImpl()));
    const auto& b = static_cast<const torch::optim::AdamWParamState&>(
        *reference.state().at(reference_params[i].unsafeGetTensorImpl()));
    CHECK(a.step() == b.step());
    CHECK(close(a.exp_avg(), b.exp_avg()));
    const double second_moment_tolerance =
        fused_params[i].is_cuda() ? cuda_second_moment_tolerance : relative_tolerance;
    CHECK(close(a.exp_avg_sq(), b.exp_avg_sq(), second_moment_tolerance));
    if (b.max_exp_avg_sq().defined()) CHECK(close(a.max_exp_avg_sq(), b.max_exp_avg_sq(), second_moment_tolerance));
  }
}

void train_side_by_side(const at::Device& device, bool amsgrad) {
  std::vector<at::Tensor> fused_params = parameters(device);
  std::vector<at::Tensor> reference_params = clones(fused_params);
  auto fused = make<loom::optim::AdamW>(fused_params, amsgrad);
  auto reference = make<torch::optim::AdamW>(reference_params, amsgrad);
  for (int step = 1; step <= 30; ++step) {
    INFO("step " << step);
    set_gradients(fused_params, step);
    set_gradients(reference_params, step);
    fused.step();
    reference.step();
    check_same(fused, fused_params, reference, reference_params);
    change_rates(fused, step);
    change_rates(reference, step);
  }
  // The moments moved far from zero: a wrong kernel argument would not pass for rounding.
  CHECK_FALSE(fused_params[0].detach().equal(parameters(device)[0].detach()));
}

std::string saved(const torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream bytes;
  archive.save_to(bytes);
  return bytes.str();
}

void load(torch::optim::Optimizer& optimizer, const std::string& bytes) {
  torch::serialize::InputArchive archive;
  archive.load_from(bytes.data(), bytes.size());
  optimizer.load(archive);
}

}  // namespace

TEST_CASE("loom::optim::AdamW steps as torch::optim::AdamW does, within float rounding") {
  const bool amsgrad = GENERATE(false, true);
  INFO("amsgrad " << amsgrad);
  train_side_by_side(at::kCPU, amsgrad);
}

TEST_CASE("loom::optim::AdamW steps as torch::optim::AdamW does on CUDA") {
  if (!torch::cuda::is_available()) {
    SUCCEED("no CUDA device here: scripts/gpu-check runs this case on one");
    return;
  }
  train_side_by_side(at::Device(at::kCUDA, 0), GENERATE(false, true));
}

TEST_CASE("loom::optim::AdamW's files load into torch::optim::AdamW and back, and training goes on alike") {
  std::vector<at::Tensor> fused_params = parameters(at::kCPU);
  auto fused = make<loom::optim::AdamW>(fused_params, false);
  for (int step = 1; step <= 4; ++step) {
    set_gradients(fused_params, step);
    fused.step();
  }
  // The fused optimizer's file, loaded by torch's over copies of the parameters...
  std::vector<at::Tensor> reference_params = clones(fused_params);
  auto reference = make<torch::optim::AdamW>(reference_params, false);
  load(reference, saved(fused));
  // ... and torch's file loaded by a fresh fused one over copies of its own.
  std::vector<at::Tensor> reloaded_params = clones(fused_params);
  auto reloaded = make<loom::optim::AdamW>(reloaded_params, false);
  load(reloaded, saved(reference));
  for (int step = 5; step <= 10; ++step) {
    INFO("step " << step);
    for (auto* params : {&fused_params, &reference_params, &reloaded_params}) set_gradients(*params, step);
    fused.step();
    reference.step();
    reloaded.step();
    check_same(fused, fused_params, reference, reference_params);
    check_same(reloaded, reloaded_params, reference, reference_params);
  }
  // Its state is torch's AdamW state, so an asynchronous checkpoint copies it as it copies torch's.
  CHECK(loom::copied_state(*fused.state().begin()->second, [](const at::Tensor& t) { return t.clone(); }) != nullptr);
}

TEST_CASE("loom::optim::AdamW refuses a sparse gradient and a parameter it cannot step in place") {
  SECTION("sparse") {
    at::Tensor p = torch::zeros({4, 2}).requires_grad_(true);
    p.mutable_grad() = torch::ones({4, 2}).to_sparse();
    loom::optim::AdamW optimizer(std::vector<at::Tensor>{p});
    CHECK_THROWS_WITH(optimizer.step(), ContainsSubstring("parameter 0 of group 0 has a sparse gradient") &&
                                            ContainsSubstring("sparse = false"));
  }
  SECTION("overlapping") {
    at::Tensor p = torch::zeros({4}).as_strided({2, 2}, {1, 1}).detach().requires_grad_(true);
    p.mutable_grad() = torch::ones({2, 2});
    loom::optim::AdamW optimizer(std::vector<at::Tensor>{p});
    CHECK_THROWS_WITH(optimizer.step(),
                      ContainsSubstring("parameter 0 of group 0 (sizes [2, 2], strides [1, 1]) overlaps itself") &&
                          ContainsSubstring("torch::optim::AdamW"));
  }
}

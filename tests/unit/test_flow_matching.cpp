// Flow matching against diffusers' own functions, which FastVideo's fine-tune method calls (its
// compute_density_for_timestep_sampling is diffusers', its FlowMatchEulerDiscreteScheduler a copy):
// the values below are theirs, printed by this script (diffusers 0.42.1, torch 2.13, CPU):
//
//   import torch
//   from diffusers import FlowMatchEulerDiscreteScheduler
//   from diffusers.training_utils import compute_density_for_timestep_sampling
//   sched = FlowMatchEulerDiscreteScheduler(shift=3.0)
//   x0 = (torch.arange(24, dtype=torch.float32).reshape(4, 2, 3) - 11.5) / 8
//   g = torch.Generator().manual_seed(7)
//   noise = torch.randn(x0.shape, generator=g)
//   u = compute_density_for_timestep_sampling(scheme, 4, logit_mean=0.5, logit_std=1.5, mode_scale=1.29,
//                                             generator=g)
//   idx = (u * 1000).long(); t = sched.timesteps[idx]; s = sched.sigmas[idx].view(-1, 1, 1)
//   noisy = (1.0 - s) * x0 + s * noise
//   loss = torch.nn.functional.mse_loss(torch.full_like(x0, 0.25), noise - x0)
//
// The draws' moments and the shift are checked against their closed forms.
#include <loom/train/euler_sampler.hpp>
#include <loom/train/flow_matching.hpp>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <numbers>
#include <vector>

using Catch::Approx;
using Catch::Matchers::ContainsSubstring;

namespace {

std::vector<float> values(const at::Tensor& tensor) {
  const at::Tensor flat = tensor.to(at::kFloat).contiguous().flatten();
  return {flat.data_ptr<float>(), flat.data_ptr<float>() + flat.numel()};
}

std::vector<std::int64_t> whole_values(const at::Tensor& tensor) {
  const at::Tensor flat = tensor.contiguous().flatten();
  return {flat.data_ptr<std::int64_t>(), flat.data_ptr<std::int64_t>() + flat.numel()};
}

at::Tensor clean_latents() { return (at::arange(24, at::kFloat).reshape({4, 2, 3}) - 11.5) / 8; }

struct expected_draw {
  loom::timestep_density density;
  std::vector<float> u;
  std::vector<std::int64_t> levels;
  std::vector<float> timesteps, sigmas, noisy_first_row, noisy_last_row;
};

}  // namespace

TEST_CASE("the schedule's levels are diffusers' FlowMatchEulerDiscreteScheduler(shift=3)'s, bit for bit",
          "[flow_matching]") {
  const loom::flow_matching method({.flow_shift = 3.0});
  REQUIRE(method.sigmas().numel() == 1000);
  CHECK(values(method.sigmas().slice(0, 0, 3)) == std::vector<float>{1.0F, 0.9996663928031921F, 0.9993324279785156F});
  CHECK(values(method.sigmas().slice(0, 998)) == std::vector<float>{0.005976095795631409F, 0.002994012087583542F});
  CHECK(values(method.timesteps().slice(0, 0, 2)) == std::vector<float>{1000.0F, 999.6663818359375F});
  CHECK(values(method.timesteps().slice(0, 999)) == std::vector<float>{2.9940121173858643F});
}

TEST_CASE("the shift maps σ as FastVideo's flow_shift does", "[flow_matching]") {
  CHECK(loom::shifted_sigma(0.5, 3.0) == Approx(0.75));
  CHECK(loom::shifted_sigma(0.25, 3.0) == Approx(0.5));  // 0.75 / 1.5
  CHECK(loom::shifted_sigma(0.0, 5.0) == 0.0);
  CHECK(loom::shifted_sigma(1.0, 5.0) == 1.0);
  CHECK(loom::shifted_sigma(0.3, 1.0) == Approx(0.3));  // no shift
  // Every level of the table, unshifted (N − k) / N, is shifted so.
  const loom::flow_matching method({.flow_shift = 5.0, .num_train_timesteps = 10});
  const std::vector<float> sigmas = values(method.sigmas());
  for (std::size_t k = 0; k < sigmas.size(); ++k) {
    CHECK(sigmas[k] == Approx(loom::shifted_sigma((10.0 - static_cast<double>(k)) / 10.0, 5.0)).epsilon(1e-6));
  }
}

TEST_CASE("noise, levels, inputs and loss are FastVideo's (diffusers') for each density, bit for bit",
          "[flow_matching]") {
  const std::vector<expected_draw> cases{
      {loom::timestep_density::uniform,
       {0.7405239939689636F, 0.25287991762161255F, 0.23315048217773438F, 0.9314137697219849F},
       {740, 252, 233, 931},
       {513.1578979492188F, 899.0384521484375F, 908.0505981445312F, 181.89805603027344F},
       {0.5131579041481018F, 0.8990384340286255F, 0.9080505967140198F, 0.1818980574607849F},
       {-1.1206940412521362F, -0.43595901131629944F, -0.11684301495552063F},
       {1.0592353343963623F, 1.3282194137573242F, 1.4317435026168823F}},
      {loom::timestep_density::logit_normal,
       {0.9596405029296875F, 0.29382139444351196F, 0.45345306396484375F, 0.3573901057243347F},
       {959, 293, 453, 357},
       {113.67837524414062F, 878.6246948242188F, 783.6676635742188F, 843.83203125F},
       {0.11367837339639664F, 0.878624677658081F, 0.7836676836013794F, 0.8438320159912109F},
       {-1.367318868637085F, -1.1183223724365234F, -0.9503204822540283F},
       {0.5924753546714783F, 1.3854225873947144F, 1.4107952117919922F}},
      {loom::timestep_density::mode,
       {0.3915063440799713F, 0.613966166973114F, 0.6315090656280518F, 0.142147496342659F},
       {391, 613, 631, 142},
       {823.7151489257812F, 654.4532470703125F, 636.9390258789062F, 947.7171020507812F},
       {0.8237151503562927F, 0.6544532179832458F, 0.6369390487670898F, 0.9477171301841736F},
       {-0.928966760635376F, 0.09451352059841156F, 0.5311062932014465F},
       {0.5192211866378784F, 1.3944002389907837F, 1.4075074195861816F}},
  };
  for (const expected_draw& expected : cases) {
    INFO(loom::to_string(expected.density));
    const loom::flow_matching method(
        {.weighting_scheme = expected.density, .logit_mean = 0.5, .logit_std = 1.5, .mode_scale = 1.29});
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(7);
    const at::Tensor x0 = clean_latents();
    const loom::flow_matching_inputs inputs = method.noise(x0, generator);
    CHECK(values(inputs.timesteps) == expected.timesteps);
    CHECK(values(inputs.sigmas) == expected.sigmas);
    CHECK(values(inputs.noisy[0][0]) == expected.noisy_first_row);
    CHECK(values(inputs.noisy[3][1]) == expected.noisy_last_row);
    CHECK(inputs.noisy.scalar_type() == at::kFloat);
    CHECK(values(inputs.velocity)[0] == -0.8201345205307007F - values(x0)[0]);
    const at::Tensor loss = loom::flow_matching::loss(at::full_like(x0, 0.25), inputs);
    CHECK(loss.item<float>() == 1.4714385271072388F);

    // The same u and levels drawn alone, after the noise, from the same seed.
    at::Generator again = at::make_generator<at::CPUGeneratorImpl>(7);
    (void)at::randn(x0.sizes(), again, x0.options());
    const at::Tensor u = method.draw_u(4, again);
    CHECK(values(u) == expected.u);
    CHECK(whole_values(method.levels(u)) == expected.levels);
  }
}

TEST_CASE("the densities' moments: uniform, logit-normal's logit, and mode's mean against its integral",
          "[flow_matching]") {
  constexpr std::int64_t draws = 400'000;
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(11);

  const at::Tensor uniform = loom::flow_matching({}).draw_u(draws, generator).to(at::kDouble);
  CHECK(uniform.mean().item<double>() == Approx(0.5).margin(3e-3));
  CHECK(uniform.var().item<double>() == Approx(1.0 / 12).margin(1e-3));
  CHECK(uniform.min().item<double>() >= 0.0);
  CHECK(uniform.max().item<double>() < 1.0);

  const loom::flow_matching logit_normal(
      {.weighting_scheme = loom::timestep_density::logit_normal, .logit_mean = -0.7, .logit_std = 1.3});
  const at::Tensor u = logit_normal.draw_u(draws, generator).to(at::kDouble);
  const at::Tensor logit = at::log(u / (1 - u));
  CHECK(logit.mean().item<double>() == Approx(-0.7).margin(1e-2));
  CHECK(logit.std().item<double>() == Approx(1.3).margin(1e-2));

  // u = f(v), v uniform: E[f] and E[f²] by the midpoint rule over v.
  constexpr double scale = 0.8;
  const auto f = [](double v) {
    const double c = std::cos(std::numbers::pi * v / 2);
    return 1 - v - scale * (c * c - 1 + v);
  };
  constexpr int points = 100'000;
  double mean = 0, square = 0;
  for (int i = 0; i < points; ++i) {
    const double value = f((i + 0.5) / points);
    mean += value / points;
    square += value * value / points;
  }
  const loom::flow_matching mode({.weighting_scheme = loom::timestep_density::mode, .mode_scale = scale});
  const at::Tensor m = mode.draw_u(draws, generator).to(at::kDouble);
  CHECK(m.mean().item<double>() == Approx(mean).margin(3e-3));
  CHECK((m * m).mean().item<double>() == Approx(square).margin(3e-3));

  // With shift 1 and N levels, σ = 1 − ⌊uN⌋ / N: uniform u gives E[σ] = 1/2 + 1/(2N).
  const loom::flow_matching unshifted({.flow_shift = 1.0, .num_train_timesteps = 10});
  at::Tensor latents = at::zeros({draws, 1}, at::kFloat);
  const loom::flow_matching_inputs inputs = unshifted.noise(latents, generator);
  CHECK(inputs.sigmas.to(at::kDouble).mean().item<double>() == Approx(0.55).margin(3e-3));
  CHECK(at::equal(inputs.timesteps, inputs.sigmas * 10));
}

TEST_CASE("a u of 1 picks the last level; the step's generator is a function of (seed, step, rank, micro)",
          "[flow_matching]") {
  const loom::flow_matching method({});
  CHECK(whole_values(method.levels(at::tensor({0.0F, 0.9999F, 1.0F}))) == std::vector<std::int64_t>{0, 999, 999});

  const auto draw = [](std::uint64_t seed, std::int64_t step, int rank, int micro) {
    at::Generator generator = loom::step_generator(seed, step, rank, micro);
    return at::rand({8}, generator);
  };
  CHECK(at::equal(draw(3, 5, 1, 0), draw(3, 5, 1, 0)));
  CHECK_FALSE(at::equal(draw(3, 5, 1, 0), draw(3, 6, 1, 0)));
  CHECK_FALSE(at::equal(draw(3, 5, 1, 0), draw(3, 5, 0, 0)));
  CHECK_FALSE(at::equal(draw(3, 5, 1, 0), draw(3, 5, 1, 1)));
  CHECK_FALSE(at::equal(draw(3, 5, 1, 0), draw(4, 5, 1, 0)));
}

TEST_CASE("options out of range are refused naming the option; the loss refuses another shape", "[flow_matching]") {
  CHECK_THROWS_WITH(loom::flow_matching({.flow_shift = 0}),
                    ContainsSubstring("flow_shift is 0; give a positive shift"));
  CHECK_THROWS_WITH(loom::flow_matching({.logit_std = -1}), ContainsSubstring("logit_std is -1"));
  CHECK_THROWS_WITH(loom::flow_matching({.num_train_timesteps = 0}), ContainsSubstring("num_train_timesteps is 0"));
  CHECK(loom::timestep_density_named("logit_normal") == loom::timestep_density::logit_normal);
  CHECK_FALSE(loom::timestep_density_named("lognorm").has_value());
  CHECK(loom::flow_matching_options{}.describe() ==
        "weighting_scheme=uniform, logit_mean=0, logit_std=1, mode_scale=1, flow_shift=3, num_train_timesteps=1000, "
        "precondition_outputs=false, training_cfg_rate=0, boundary_ratio=0");
  CHECK_THROWS_WITH(loom::flow_matching({.training_cfg_rate = -0.1}),
                    ContainsSubstring("training_cfg_rate is -0.1; give a probability in [0, 1]"));

  const loom::flow_matching method({});
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(1);
  const loom::flow_matching_inputs inputs = method.noise(at::zeros({2, 3}), generator);
  CHECK_THROWS_WITH(loom::flow_matching::loss(at::zeros({2, 4}), inputs),
                    ContainsSubstring("the prediction has shape [2, 4], the velocity [2, 3]"));
}

TEST_CASE("precondition_outputs: FastVideo's x0 form, mse(x_sigma - sigma * v, x0), in the latents' dtype then fp32",
          "[flow_matching]") {
  const at::Tensor x0 = (at::arange(24, at::kFloat).reshape({4, 2, 3}) - 11.5) / 8;
  const at::Tensor prediction = at::linspace(-1, 1, 24, at::kFloat).reshape({4, 2, 3});
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    CAPTURE(dtype);
    at::Generator a = at::make_generator<at::CPUGeneratorImpl>(7);
    at::Generator b = at::make_generator<at::CPUGeneratorImpl>(7);
    const loom::flow_matching velocity_form({.flow_shift = 3});
    const loom::flow_matching x0_form({.flow_shift = 3, .precondition_outputs = true});
    const loom::flow_matching_inputs plain = velocity_form.noise(x0.to(dtype), a);
    const loom::flow_matching_inputs in = x0_form.noise(x0.to(dtype), b);
    // The same draws either way: only the loss differs.
    CHECK(at::equal(plain.noisy, in.noisy));
    CHECK_FALSE(plain.clean.defined());
    // FastVideo (fastvideo/train/methods/fine_tuning/finetune.py): its sigmas in the latents' dtype
    // (get_sigmas(..., dtype=latents.dtype)), pred_x0 = noisy - prediction * sigmas, then
    // mse(pred_x0.float(), latents.float()).
    const at::Tensor model_pred = prediction.to(dtype);
    const at::Tensor pred_x0 = in.noisy - model_pred * in.sigmas.to(dtype).view({4, 1, 1});
    const at::Tensor expected = at::mse_loss(pred_x0.to(at::kFloat), x0.to(dtype).to(at::kFloat));
    CHECK(at::equal(loom::flow_matching::loss(model_pred, in), expected));
    CHECK_FALSE(at::equal(loom::flow_matching::loss(model_pred, in), loom::flow_matching::loss(model_pred, plain)));
    CHECK(at::equal(loom::flow_matching::loss(model_pred, plain),
                    at::mse_loss(model_pred.to(at::kFloat), plain.velocity)));
  }
}

TEST_CASE("training_cfg_rate drops each sample's text to the unconditional states with that probability",
          "[flow_matching]") {
  const std::int64_t batch = 4000;
  const at::Tensor text = at::arange(1, batch + 1, at::kFloat).view({batch, 1, 1}).expand({batch, 3, 2}).contiguous();
  const at::Tensor unconditional = at::full({1, 3, 2}, -7.0F);
  const loom::flow_matching never({});
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(11);
  CHECK(never.dropped_text(text, unconditional, generator).is_same(text));  // and nothing drawn
  for (const double rate : {0.1, 0.5, 1.0}) {
    CAPTURE(rate);
    const loom::flow_matching method({.training_cfg_rate = rate});
    at::Generator draws = at::make_generator<at::CPUGeneratorImpl>(11);
    at::Generator same = at::make_generator<at::CPUGeneratorImpl>(11);
    const at::Tensor dropped = method.dropped_text(text, unconditional, draws);
    // Sample i is dropped exactly where the i-th U[0, 1) draw falls below the rate, wholly.
    const at::Tensor expected_drop = at::rand({batch}, same) < rate;
    const at::Tensor is_dropped = (dropped == -7.0F).all(2).all(1);
    const at::Tensor kept = (dropped == text).all(2).all(1);
    CHECK(at::equal(is_dropped, expected_drop));
    CHECK(at::equal(kept, expected_drop.logical_not()));
    const double share = is_dropped.to(at::kDouble).mean().item<double>();
    CHECK(share == Approx(rate).margin(0.025));
  }
  // Per-sample unconditional states ([B, ...]) are taken row by row.
  const loom::flow_matching always({.training_cfg_rate = 1.0});
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(3);
  const at::Tensor rows = at::randn({2, 3, 2});
  CHECK(at::equal(always.dropped_text(text.narrow(0, 0, 2), rows, g), rows));
  CHECK_THROWS_WITH(
      always.dropped_text(text, at::zeros({1, 4, 2}), g),
      ContainsSubstring("the unconditional text states have shape [1, 4, 2] and the batch's [4000, 3, 2]"));
}

TEST_CASE("boundary_ratio: each expert's levels are on its side of the boundary, and a step's expert is its own",
          "[flow_matching]") {
  // Wan 2.2 A14B's: boundary 0.875 over 1000 levels shifted by 3 (diffusers compares t >= 875 in fp32).
  const loom::flow_matching method({.boundary_ratio = 0.875});
  const at::Tensor& timesteps = method.timesteps();
  const std::int64_t high = method.high_noise_levels();
  REQUIRE(high > 0);
  REQUIRE(high < 1000);
  CHECK(timesteps[high - 1].item<float>() >= 875.0F);
  CHECK(timesteps[high].item<float>() < 875.0F);
  auto draws = at::make_generator<at::CPUGeneratorImpl>(7);
  const at::Tensor x0 = at::randn({4000, 2});
  const auto high_inputs = method.noise(x0, draws, loom::noise_expert::high_noise);
  const auto low_inputs = method.noise(x0, draws, loom::noise_expert::low_noise);
  CHECK(high_inputs.timesteps.min().item<float>() >= 875.0F);
  CHECK(low_inputs.timesteps.max().item<float>() < 875.0F);
  // Spread over the whole range of each (u uniform): the ends within a few levels.
  CHECK(high_inputs.timesteps.max().item<float>() > timesteps[3].item<float>());
  CHECK(low_inputs.timesteps.min().item<float>() < timesteps[996].item<float>());
  // ε drawn first, as noise() draws it.
  auto epsilon_draws = at::make_generator<at::CPUGeneratorImpl>(7);
  const at::Tensor epsilon = at::randn(x0.sizes(), epsilon_draws, x0.options());
  CHECK(at::allclose(high_inputs.velocity, epsilon - x0));

  // A step's expert: a function of (seed, step), low-noise at the boundary's rate.
  int low = 0;
  for (std::int64_t step = 0; step < 4000; ++step) {
    const loom::noise_expert expert = method.expert_for_step(3, step);
    CHECK(expert == method.expert_for_step(3, step));
    low += expert == loom::noise_expert::low_noise ? 1 : 0;
  }
  CHECK(std::abs(low / 4000.0 - 0.875) < 0.02);

  CHECK_THROWS_WITH(loom::flow_matching({.boundary_ratio = 1.0}),
                    ContainsSubstring("boundary_ratio is 1; give the experts' boundary in (0, 1), e.g. 0.875"));
  const loom::flow_matching single({});
  CHECK_THROWS_WITH(single.expert_for_step(3, 0),
                    ContainsSubstring("flow_matching::expert_for_step: the options give no boundary_ratio"));
}

TEST_CASE("the sampler guides the low-noise expert's steps by guidance_scale_2, as WanPipeline switches them",
          "[flow_matching]") {
  // shift 3, 7 steps: timesteps 1000, 937.7, 857.7, 751.1, 602.2, 379.2, 8.9.
  const loom::flow_euler_sampler two(
      {.num_inference_steps = 7, .shift = 3, .guidance_scale = 5, .guidance_scale_2 = 2, .boundary_ratio = 0.8});
  const at::Tensor high = two.timesteps().ge(static_cast<float>(0.8 * 1000));
  REQUIRE(two.guidance_scales().size() == 7);
  for (std::size_t i = 0; i < 7; ++i) {
    CAPTURE(i);
    CHECK(two.guidance_scales()[i] == (high[static_cast<std::int64_t>(i)].item<bool>() ? 5.0 : 2.0));
  }
  CHECK(high.sum().item<std::int64_t>() == 3);
  // A boundary at a step's own fp32 timestep: that step is the high-noise expert's.
  const float third = two.timesteps()[2].item<float>();
  const loom::flow_euler_sampler at_a_step({.num_inference_steps = 7,
                                            .shift = 3,
                                            .guidance_scale = 5,
                                            .guidance_scale_2 = 2,
                                            .boundary_ratio = third / 1000.0});
  CHECK(at_a_step.guidance_scales()[2] == 5.0);
  CHECK(at_a_step.guidance_scales()[3] == 2.0);
  // Unset, the low-noise expert takes guidance_scale, as WanPipeline defaults it; one model, one scale.
  const loom::flow_euler_sampler unset({.num_inference_steps = 7, .guidance_scale = 4, .boundary_ratio = 0.8});
  const loom::flow_euler_sampler one({.num_inference_steps = 7, .guidance_scale = 4});
  CHECK(unset.guidance_scales() == std::vector<double>(7, 4.0));
  CHECK(one.guidance_scales() == std::vector<double>(7, 4.0));
  CHECK(loom::flow_euler_sampler_options{.guidance_scale_2 = 2, .boundary_ratio = 0.875}.describe() ==
        "num_inference_steps=50, shift=3, guidance_scale=5, num_train_timesteps=1000, guidance_scale_2=2, "
        "boundary_ratio=0.875");

  CHECK_THROWS_WITH(loom::flow_euler_sampler({.guidance_scale_2 = 2}),
                    ContainsSubstring("guidance_scale_2 is 2, the low-noise expert's scale, and boundary_ratio is 0"));
  CHECK_FALSE(loom::flow_euler_sampler_options{.guidance_scale_2 = 2}.problem());  // a run file may leave it out
  CHECK_THROWS_WITH(loom::flow_euler_sampler({.guidance_scale = 1, .guidance_scale_2 = 3, .boundary_ratio = 0.875}),
                    ContainsSubstring("guidance_scale 1 (at most 1) turns guidance off for both experts"));
  CHECK_THROWS_WITH(loom::flow_euler_sampler({.boundary_ratio = 1}), ContainsSubstring("boundary_ratio is 1; give"));
  CHECK_THROWS_WITH(loom::flow_euler_sampler({.guidance_scale_2 = NAN, .boundary_ratio = 0.875}),
                    ContainsSubstring("guidance_scale_2 is nan; give a finite scale"));
}

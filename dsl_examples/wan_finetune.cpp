// wan-finetune: LoRA fine-tuning of a diffusers Wan checkpoint (WanTransformer3DModel, text to video)
// by flow matching as FastVideo's fine-tune method trains it (loom/train/flow_matching.hpp), under
// loom::train, from a run file in FastVideo's YAML layout (its example configs as they are, or TOML or
// JSON), on precomputed latents and text states: loom's clip files (dsl_examples/data/
// make_wan_latents.py) or FastVideo's Parquet dataset. The checkpoint is the plan's pretrained stage,
// its config.json the model. Checkpoints, resume, preemption, evaluation and metrics are loom::train's;
// with the file's ema the weights' average is kept, evaluated and saved on asking; with its sampling
// each evaluation samples the held-out clips (loom/train/euler_sampler.hpp). The adapter is written at
// the end in PEFT's format, and with --merged the weights with the adapters merged in, as diffusers
// reads them. Given a Wan 2.2 A14B pipeline's folder (model_index.json with its boundary_ratio,
// transformer/ and transformer_2/), it trains both experts in one plan, one a step, the same on every
// rank (loom::flow_matching::expert_for_step), and writes an adapter for each. README.md has a run.
//
//   build/loom-run --nproc-per-node 2 -- build/dsl_examples/wan-finetune
//       --config dsl_examples/configs/wan_finetune.yaml --pretrained DIR --data clips/ [--out DIR]
//       [--batch-size 1] [--text-len 512] [--merged] [--lora.rank=32] [--train.steps=100] ...
#include "common/adapter.hpp"
#include "common/checkpoint_folder.hpp"
#include "common/command_line.hpp"
#include "common/run_folder.hpp"
#include "models/latent_clips.hpp"
#include "models/video_clips.hpp"

#include <loom/config/run_file.hpp>
#include <loom/io/safetensors.hpp>
#include <loom/loom.hpp>
#include <loom/models/wan.hpp>
#include <loom/models/wan_experts.hpp>
#include <loom/optim/adamw.hpp>
#include <loom/precision/precision.hpp>
#include <loom/runtime/host_reads.hpp>
#include <loom/train/ema.hpp>
#include <loom/train/euler_sampler.hpp>
#include <loom/train/flow_matching.hpp>

#include <fmt/core.h>
#include <fmt/ranges.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

namespace fs = std::filesystem;

namespace {

struct options {
  recipes::run_file_arguments run_file;
  std::string data;                            // else the run file's data.path
  std::optional<std::int64_t> batch_per_rank;  // else the run file's data.batch_size, else 1
  std::int64_t text_len = 512;
  bool merged = false;
  bool save_ema = false;
  std::string negative_text;
};

std::variant<options, int> parse(int argc, char** argv) {
  options parsed;
  CLI::App app{
      "LoRA fine-tuning of a diffusers Wan checkpoint by flow matching, as FastVideo's fine-tune method, "
      "on precomputed latents, from a run file.",
      "wan-finetune"};
  parsed.run_file.add_to(app, /*required=*/true);
  parsed.run_file.add_folders_to(app);
  app.add_option("--data", parsed.data,
                 "a folder of clips, one .safetensors file each (vae_latent, text_embedding; "
                 "dsl_examples/data/make_wan_latents.py), or FastVideo's Parquet dataset (a folder of *.parquet "
                 "files as its preprocessing writes them); its last tenth is held out. Default: the run file's "
                 "data.path (FastVideo's training.data.data_path)");
  app.add_option("--batch-size", parsed.batch_per_rank,
                 "clips per rank and micro-batch (default: the run file's data.batch_size, FastVideo's "
                 "train_batch_size, else 1)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  app.add_option("--text-len", parsed.text_len, "text states per clip, padded with zeros or cut (Wan's T5: 512)")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  app.add_flag("--merged", parsed.merged,
               "also write the weights with the adapters merged in, for diffusers (WanTransformer3DModel)");
  app.add_flag("--save-ema", parsed.save_ema,
               "with the run file's ema: also write the adapter of the weights' average, as adapter-ema/, and with "
               "--merged write merged-ema/ (the average merged in) in place of merged/");
  app.add_option(
      "--negative-text", parsed.negative_text,
      "a .safetensors file whose text_embedding [L, D] is the negative prompt's text states, for the "
      "sampling's classifier-free guidance (default: zeros, what training_cfg_rate trains as unconditional)");
  if (const auto exit_code = recipes::parse_command_line(app, argc, argv)) return *exit_code;
  return parsed;
}

// The first clip against the model: its channels and its text width are the config's.
void check_clip_fits(const latent_clips::batch& clip, const fs::path& file,
                     const loom::models::wan_config& model_config, const fs::path& checkpoint) {
  if (clip.latents.size(0) != model_config.in_channels || clip.text.size(1) != model_config.text_dim) {
    throw std::invalid_argument(fmt::format(
        "clip '{}' has latents of {} channels and text states {} wide, but the checkpoint '{}' takes in_channels {} "
        "and text_dim {}: make the clips for this model (make_wan_latents.py --channels, --text-dim)",
        file.string(), clip.latents.size(0), clip.text.size(1), checkpoint.string(), model_config.in_channels,
        model_config.text_dim));
  }
}

// A clip's tokens are its patches: (F / p_t) · (H / p_h) · (W / p_w) of its latents [C, F, H, W].
std::array<std::int64_t, 3> patches_of(const latent_clips::batch& clip, const loom::models::wan_config& model_config) {
  const auto& [frames, height, width] = model_config.patch_size;
  return {clip.latents.size(1) / frames, clip.latents.size(2) / height, clip.latents.size(3) / width};
}

// Sequence parallelism splits a clip's tokens over its ranks, so their number must divide; refused
// here in the clips' and the file's words.
void check_clip_splits(const latent_clips::batch& clip, const loom::models::wan_config& model_config,
                       const loom::run_file& file, int world_size, const std::string& data) {
  if (!file.sequence_group) return;
  const auto& [frames, height, width] = model_config.patch_size;
  const auto [f, h, w] = patches_of(clip, model_config);
  const std::int64_t tokens = f * h * w;
  const int k = file.sequence_group->ranks;
  if (tokens % k == 0) return;
  std::vector<int> fitting;
  for (int size = 1; size <= world_size; ++size) {
    if (world_size % size == 0 && tokens % size == 0) fitting.push_back(size);
  }
  throw std::invalid_argument(fmt::format(
      "the clips of --data '{}' have {} × {} × {} = {} tokens after patching (latents [{}, {}, {}] in patches of "
      "[{}, {}, {}]), which {} ranks cannot split evenly ({}): give {} {} (it divides the tokens and the {} ranks), "
      "or clips whose patched frames × height × width is a multiple of {}",
      data, f, h, w, tokens, clip.latents.size(1), clip.latents.size(2), clip.latents.size(3), frames, height, width, k,
      file.sequence_group->asked_by, file.sequence_group->sizes, fmt::join(fitting, " or "), world_size, k));
}

// The negative prompt's text states [1, text_len, D] for guidance: the file's text_embedding padded
// or cut as a clip's are, or zeros, what training_cfg_rate drops the text to.
at::Tensor negative_text_states(const std::string& file, std::int64_t text_len, std::int64_t text_dim) {
  if (file.empty()) return at::zeros({1, text_len, text_dim}, at::kFloat);
  const at::Tensor text = latent_clips::load_text(file, text_len);
  if (text.size(1) != text_dim) {
    throw std::invalid_argument(fmt::format("--negative-text '{}' has text states {} wide; the model's text_dim is {}",
                                            file, text.size(1), text_dim));
  }
  return text.unsqueeze(0);
}

// One sampled clip's latents, and what a reader checks first: their statistics.
void write_sample(const fs::path& file, const at::Tensor& latents) {
  const at::Tensor values = loom::read_on_host_uncounted(latents.to(at::kFloat));
  const auto stat = [](const at::Tensor& value) { return fmt::format("{:.6g}", loom::host_value<double>(value)); };
  loom::save_safetensors(file, {{"latents", values.contiguous()}},
                         {{"mean", stat(values.mean())},
                          {"std", stat(values.std())},
                          {"min", stat(values.min())},
                          {"max", stat(values.max())}});
}

// The weights with the adapters merged in, as diffusers reads them (diffusion_pytorch_model.safetensors
// and the checkpoint's config.json; for two experts a pipeline's folder, one folder an expert). The
// last thing a run does: the base keeps the adapters folded in.
template <class Job, class Plan>
void save_merged(Job& job, const Plan& plan, const fs::path& folder, bool two_experts) {
  if (plan.template find<loom::lora_stage>()) job.merge();
  job.save_pretrained(folder);
  if (job.rt().rank() == 0) {
    fmt::print("saved {} (diffusers' format: {})\n", folder.string(),
               two_experts ? "a pipeline's transformer/ and transformer_2/, WanPipeline.from_pretrained"
                           : "WanTransformer3DModel.from_pretrained");
  }
}

// The pipeline's boundary between two experts (0 for one transformer), which the run file's `key`
// (`given`; 0 when left out) may repeat but not contradict.
double pipeline_boundary(std::string_view key, double given, double boundary_ratio, const fs::path& checkpoint) {
  if (given == 0 || given == boundary_ratio) return boundary_ratio;
  throw std::invalid_argument(
      boundary_ratio == 0
          ? fmt::format("{} is {}, but the checkpoint '{}' is one transformer: leave it out, or give a Wan 2.2 A14B "
                        "pipeline's folder (model_index.json, transformer/, transformer_2/)",
                        key, given, checkpoint.string())
          : fmt::format("{} is {}, but the pipeline '{}' splits its experts at {} (model_index.json): leave it "
                        "out, or give the pipeline's",
                        key, given, checkpoint.string(), boundary_ratio));
}

// The flow matching the run file asks for, with the pipeline's boundary.
loom::flow_matching_options matching_for(const loom::run_file& file, double boundary_ratio,
                                         const fs::path& checkpoint) {
  loom::flow_matching_options matching = file.flow_matching.value_or(loom::flow_matching_options{});
  matching.boundary_ratio =
      pipeline_boundary("flow_matching.boundary_ratio", matching.boundary_ratio, boundary_ratio, checkpoint);
  (void)loom::flow_matching(matching);  // its options checked before a model exists
  return matching;
}

// The sampler the run file asks for, if any, with the pipeline's boundary: two experts' steps below
// it are guided by sampling.guidance_scale_2.
std::optional<loom::flow_euler_sampler> sampler_for(const loom::run_file& file, double boundary_ratio,
                                                    const fs::path& checkpoint) {
  if (!file.sampling) return std::nullopt;
  loom::flow_euler_sampler_options sampling = *file.sampling;
  sampling.boundary_ratio =
      pipeline_boundary("sampling.boundary_ratio", sampling.boundary_ratio, boundary_ratio, checkpoint);
  return std::optional<loom::flow_euler_sampler>(std::in_place, sampling);
}

template <class Model, class Config>
int train_model(const options& opts, const loom::run_file& file, const fs::path& checkpoint, const Config& config);

int run(const options& opts) {
  // Everything from the files is checked before a process group or a model exists.
  const std::string& config = opts.run_file.config;
  const std::vector<std::string>& overrides = opts.run_file.overrides;
  const loom::run_file file = loom::read_run_file(config, overrides);
  const fs::path checkpoint = recipes::checkpoint_folder(file, config);
  // A pipeline's folder is Wan 2.2 A14B's two experts; a transformer's, one Wan.
  if (fs::exists(checkpoint / "model_index.json") && !fs::exists(checkpoint / "config.json")) {
    return train_model<loom::models::WanExperts>(opts, file, checkpoint,
                                                 loom::models::wan_experts_config::from_pretrained(checkpoint));
  }
  return train_model<loom::models::Wan>(opts, file, checkpoint, loom::models::wan_config::from_pretrained(checkpoint));
}

template <class Model, class Config>
int train_model(const options& opts, const loom::run_file& file, const fs::path& checkpoint, const Config& config) {
  constexpr bool two_experts = std::is_same_v<Model, loom::models::WanExperts>;
  // The experts share one shape: the clips and the text are checked against the first's.
  const loom::models::wan_config& model_config = [&]() -> const loom::models::wan_config& {
    if constexpr (two_experts) {
      return config.transformer;
    } else {
      return config;
    }
  }();
  double boundary_ratio = 0;
  if constexpr (two_experts) boundary_ratio = config.boundary_ratio;
  const loom::flow_matching_options matching = matching_for(file, boundary_ratio, checkpoint);
  const std::optional<loom::flow_euler_sampler> sampler = sampler_for(file, boundary_ratio, checkpoint);
  if (opts.save_ema && !file.ema) {
    throw std::invalid_argument(
        "--save-ema writes the weights' average, and the run file keeps none: give it an ema object "
        "(ema = {decay = 0.999}, or FastVideo's callbacks.ema), or leave --save-ema out");
  }
  const std::string data_path = !opts.data.empty()             ? opts.data
                                : file.data && file.data->path ? file.data->path->string()
                                                               : "";
  if (data_path.empty()) {
    throw std::invalid_argument(
        "no clips: give --data DIR, or data.path in the run file (FastVideo's training.data.data_path)");
  }
  const std::int64_t batch_per_rank =
      opts.batch_per_rank.value_or(file.data && file.data->batch_size ? *file.data->batch_size : 1);
  const std::string described = fmt::format("--data '{}'", data_path);
  const auto plan = loom::plan_from_file(loom::model<Model>(config), file);
  const auto seeded = plan.template find<loom::seeded_stage>();
  const std::uint64_t seed = seeded ? seeded->seed() : 0;
  const loom::launch_env env = loom::parse_launch_env();
  loom::check_world_size(file, env.world_size);
  // Under sequence_parallel(k) or tensor_parallel(k) (FastVideo's sp_size, tp_size) the k ranks of a
  // group read the same clips and draw the same noise.
  const loom::data_parallel_place data = loom::data_parallel(plan, env.rank, env.world_size);
  video_clips::source clips(data_path, seed, data, batch_per_rank, opts.text_len, described);
  const latent_clips::batch first_clip = clips.first();
  check_clip_fits(first_clip, data_path, model_config, checkpoint);
  check_clip_splits(first_clip, model_config, file, env.world_size, data_path);
  const std::size_t held = clips.held_out_clips();
  // A base held in bf16 takes bf16 inputs, as FastVideo casts its batch to the training dtype.
  const auto built_in = plan.template find<loom::default_dtype_stage>();
  const at::ScalarType input_dtype = built_in ? loom::scalar_type(built_in->type()) : at::kFloat;
  const at::Tensor negative = negative_text_states(opts.negative_text, opts.text_len, model_config.text_dim);
  loom::train_options train_options = file.train;
  const std::string folder = recipes::choose_run_folder(train_options, "wan-finetune");
  if (env.rank == 0) fmt::print("{}\n", folder);

  auto built = loom::build(plan, loom::runtime::from_env());
  return std::visit(
      [&](auto& job) {
        const loom::runtime& rt = job.rt();
        if (rt.rank() == 0) {
          for (const std::string& note : file.notes) fmt::print("{}\n", note);
          fmt::print("{}\n", job.describe());
          fmt::print("flow matching: {}\n", matching.describe());
          if (two_experts) {
            fmt::print(
                "experts: transformer at timesteps of at least {}, transformer_2 below; a step trains one, the same on "
                "every rank, transformer_2 with probability {}\n",
                matching.boundary_ratio * static_cast<double>(matching.num_train_timesteps), matching.boundary_ratio);
          }
          if (file.ema) fmt::print("ema: {}\n", file.ema->describe());
          if (sampler) {
            fmt::print("sampling at each evaluation: {}; negative prompt: {}\n", sampler->options().describe(),
                       opts.negative_text.empty() ? "zeros" : opts.negative_text);
          }
          fmt::print("data: {} clips to train on, {} held out, from {} ({})\n\n", clips.training_clips(), held,
                     data_path, clips.parquet() ? "FastVideo's Parquet dataset" : "clip files");
        }
        const double peak = train_options.lr ? train_options.lr->peak : 1e-4;
        // FastVideo's AdamW: betas (0.9, 0.999), eps 1e-8, no weight decay unless the file's optimizer asks.
        const loom::adamw_run_options adamw = file.optimizer.value_or(loom::adamw_run_options{});
        loom::optim::AdamW optimizer(job.trainable_parameters(), torch::optim::AdamWOptions(peak)
                                                                     .betas({adamw.beta1, adamw.beta2})
                                                                     .eps(adamw.eps)
                                                                     .weight_decay(adamw.weight_decay));
        if (rt.rank() == 0) {
          fmt::print("optimizer: AdamW(lr={}, betas=({}, {}), eps={}, weight_decay={})\n", peak, adamw.beta1,
                     adamw.beta2, adamw.eps, adamw.weight_decay);
        }
        const auto [f, h, w] = patches_of(first_clip, model_config);
        // Each rank's share of a micro-batch's tokens: a group of k ranks (sequence_parallel(k),
        // tensor_parallel(k)) shares its clips', 1/k each.
        train_options.tokens_per_micro_batch = batch_per_rank * f * h * w * data.world_size / rt.world_size();
        train_options.data_identity = clips.identity();
        train_options.name = "wan-finetune";
        // Its schedule on the device the levels are drawn on, and the clips copied there from pinned
        // memory: a step reads nothing on the host.
        const loom::flow_matching method(matching, rt.device());
        const at::Tensor unconditional =
            loom::to_device(at::zeros({1, opts.text_len, model_config.text_dim}), rt.device(), input_dtype);
        // With two experts, the expert is every rank's (and its noise levels on its side); the model
        // runs it without reading the timesteps.
        const auto loss_of = [&](const latent_clips::batch& clips_of, at::Generator& draws, bool training,
                                 loom::noise_expert expert) {
          const at::Tensor x0 = loom::to_device(clips_of.latents, rt.device(), input_dtype);
          const loom::flow_matching_inputs inputs =
              two_experts ? method.noise(x0, draws, expert) : method.noise(x0, draws);
          at::Tensor text = loom::to_device(clips_of.text, rt.device(), input_dtype);
          // FastVideo's training_cfg_rate drops the text to zeros; held-out losses keep it.
          if (training) text = method.dropped_text(text, unconditional, draws);
          if constexpr (two_experts) {
            return loom::flow_matching::loss(job.forward(inputs.noisy, inputs.timesteps, text, expert), inputs);
          } else {
            return loom::flow_matching::loss(job.forward(inputs.noisy, inputs.timesteps, text), inputs);
          }
        };
        const auto expert_of = [&](std::int64_t step) {
          return two_experts ? method.expert_for_step(seed, step) : loom::noise_expert::high_noise;
        };
        std::optional<loom::ema> averages;
        if (file.ema) averages.emplace(job, *file.ema);
        const at::Tensor negative_states = loom::to_device(negative, rt.device(), input_dtype);
        // Each rank samples its share of the held-out clips from fixed noise, the same at every
        // evaluation, and writes those it holds first (the rank first in its group, where a group
        // of ranks shares its clips).
        const int group_size = rt.world_size() / data.world_size;
        const auto validate = [&](std::int64_t step) {
          const auto [share, indices] = clips.held_out_share();
          const fs::path folder = train_options.out / "validation" / fmt::format("step-{:08}", step);
          for (std::size_t i = 0; i < indices.size(); ++i) {
            const auto clip = static_cast<std::int64_t>(i);
            at::Generator fixed = loom::step_generator(seed, -1, static_cast<int>(indices[i]), 0);
            const at::Tensor noise = at::randn(share.latents.narrow(0, clip, 1).sizes(), fixed, at::kFloat);
            const at::Tensor latents = sampler->sample(
                [&](const at::Tensor& x, const at::Tensor& t, const at::Tensor& text) {
                  return job.forward(x, t, text);
                },
                loom::to_device(noise, rt.device(), at::kFloat),
                loom::to_device(share.text.narrow(0, clip, 1), rt.device(), input_dtype), negative_states, input_dtype);
            const bool first_holder =
                static_cast<std::size_t>(data.rank) + i * static_cast<std::size_t>(data.world_size) < held;
            if (first_holder && rt.rank() % group_size == 0) {
              fs::create_directories(folder);
              write_sample(folder / fmt::format("clip-{:04}.safetensors", indices[i]), latents);
            }
          }
          if (rt.rank() == 0) fmt::print("step {}: sampled the held-out clips into {}\n", step, folder.string());
        };
        const loom::train_functions functions{
            .loss =
                [&](std::int64_t step, int micro) {
                  at::Generator draws = loom::step_generator(seed, step, data.rank, micro, rt.device());
                  return loss_of(clips.next((step - 1) * train_options.accumulate + micro), draws, true,
                                 expert_of(step));
                },
            // The same noise and levels at every evaluation: step 0, which no training step is, and
            // each held-out clip's index in place of the rank. Two experts are each evaluated on every
            // clip, on levels of their side: every rank runs the same expert in each pass.
            .eval_loss =
                [&] {
                  const auto [share, indices] = clips.held_out_share();
                  at::Tensor sum = at::zeros({}, at::TensorOptions().device(rt.device()));
                  const std::vector<loom::noise_expert> experts =
                      two_experts ? std::vector{loom::noise_expert::high_noise, loom::noise_expert::low_noise}
                                  : std::vector{loom::noise_expert::high_noise};
                  for (std::size_t i = 0; i < indices.size(); ++i) {
                    for (const loom::noise_expert expert : experts) {
                      at::Generator draws = loom::step_generator(seed, 0, static_cast<int>(indices[i]), 0, rt.device());
                      const auto clip = static_cast<std::int64_t>(i);
                      sum += loss_of({share.latents.narrow(0, clip, 1), share.text.narrow(0, clip, 1)}, draws, false,
                                     expert);
                    }
                  }
                  return sum / static_cast<double>(indices.size() * experts.size());
                },
            .validate = sampler ? std::function<void(std::int64_t)>(validate) : nullptr,
            // The Parquet dataset reads in order: its position goes into every checkpoint.
            .data_state = clips.parquet() ? std::function<std::string()>([&] { return clips.state(); }) : nullptr,
            .restore_data = clips.parquet() ? std::function<void(const std::string&)>(
                                                  [&](const std::string& at) { clips.restore(at); })
                                            : nullptr};
        const loom::train_result result = averages ? loom::train(job, optimizer, *averages, functions, train_options)
                                                   : loom::train(job, optimizer, functions, train_options);
        if (result.outcome == loom::train_outcome::preempted) return loom::resumable_exit_code;
        recipes::save_adapter_if_adapted(job, plan, train_options.out / "adapter");
        // Merging changes the base, so one merged model is written: the average's with --save-ema.
        if (opts.save_ema) {
          const auto in_place = averages->swapped_in();
          recipes::save_adapter_if_adapted(job, plan, train_options.out / "adapter-ema");
          if (opts.merged) save_merged(job, plan, train_options.out / "merged-ema", two_experts);
        } else if (opts.merged) {
          save_merged(job, plan, train_options.out / "merged", two_experts);
        }
        return 0;
      },
      built);
}

}  // namespace

int main(int argc, char** argv) { return recipes::run_main<options>("wan-finetune", argc, argv, parse, run); }

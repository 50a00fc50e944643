// wan-finetune: LoRA fine-tuning of a diffusers Wan checkpoint (WanTransformer3DModel, text to video)
// by flow matching as FastVideo's fine-tune method trains it (loom/train/flow_matching.hpp), under
// loom::train, from a run file in FastVideo's YAML layout (or TOML or JSON), on precomputed latents
// and text states (dsl_examples/data/make_wan_latents.py). The checkpoint is the plan's pretrained
// stage, its config.json the model. Checkpoints, resume, preemption, validation and metrics are
// loom::train's; the adapter is written at the end in PEFT's format, and with --merged the weights
// with the adapters merged in, as diffusers reads them. README.md has a run.
//
//   build/loom-run --nproc-per-node 2 -- build/dsl_examples/wan-finetune
//       --config dsl_examples/configs/wan_finetune.yaml --pretrained DIR --data clips/ [--out DIR]
//       [--batch-size 1] [--text-len 512] [--merged] [--lora.rank=32] [--train.steps=100] ...
#include "common/adapter.hpp"
#include "common/checkpoint_folder.hpp"
#include "common/command_line.hpp"
#include "common/run_folder.hpp"
#include "models/latent_clips.hpp"

#include <loom/config/run_file.hpp>
#include <loom/loom.hpp>
#include <loom/models/wan.hpp>
#include <loom/optim/adamw.hpp>
#include <loom/precision/precision.hpp>
#include <loom/runtime/host_reads.hpp>
#include <loom/train/flow_matching.hpp>

#include <fmt/core.h>
#include <fmt/ranges.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <string>
#include <variant>
#include <vector>

namespace fs = std::filesystem;

namespace {

struct options {
  recipes::run_file_arguments run_file;
  std::string data;
  std::int64_t batch_per_rank = 1;
  std::int64_t text_len = 512;
  bool merged = false;
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
                 "dsl_examples/data/make_wan_latents.py); its last tenth is held out")
      ->required();
  app.add_option("--batch-size", parsed.batch_per_rank, "clips per rank and micro-batch")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  app.add_option("--text-len", parsed.text_len, "text states per clip, padded with zeros or cut (Wan's T5: 512)")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  app.add_flag("--merged", parsed.merged,
               "also write the weights with the adapters merged in, for diffusers (WanTransformer3DModel)");
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

int run(const options& opts) {
  // Everything from the files is checked before a process group or a model exists.
  const std::string& config = opts.run_file.config;
  const std::vector<std::string>& overrides = opts.run_file.overrides;
  const loom::run_file file = loom::read_run_file(config, overrides);
  const fs::path checkpoint = recipes::checkpoint_folder(file, config);
  const loom::models::wan_config model_config = loom::models::wan_config::from_pretrained(checkpoint);
  const loom::flow_matching_options matching = file.flow_matching.value_or(loom::flow_matching_options{});
  (void)loom::flow_matching(matching);  // its options checked before a model exists
  const std::vector<fs::path> clips = latent_clips::clip_files(opts.data);
  const latent_clips::batch first_clip = latent_clips::load_clip(clips.front(), opts.text_len);
  check_clip_fits(first_clip, clips.front(), model_config, checkpoint);
  const std::size_t held = std::max<std::size_t>(1, clips.size() / 10);
  const auto split = clips.end() - static_cast<std::ptrdiff_t>(held);
  const auto plan = loom::plan_from_file(loom::model<loom::models::Wan>(model_config), file);
  const auto seeded = plan.find<loom::seeded_stage>();
  const std::uint64_t seed = seeded ? seeded->seed() : 0;
  const loom::launch_env env = loom::parse_launch_env();
  loom::check_world_size(file, env.world_size);
  check_clip_splits(first_clip, model_config, file, env.world_size, opts.data);
  // Under sequence_parallel(k) or tensor_parallel(k) (FastVideo's sp_size, tp_size) the k ranks of a
  // group read the same clips and draw the same noise.
  const loom::data_parallel_place data = loom::data_parallel(plan, env.rank, env.world_size);
  const latent_clips::sampler batches(std::vector<fs::path>(clips.begin(), split), seed, data.rank, data.world_size,
                                      opts.batch_per_rank, opts.text_len,
                                      fmt::format("the clips of --data '{}' but its last tenth", opts.data));
  const latent_clips::sampler held_out(std::vector<fs::path>(split, clips.end()), seed, data.rank, data.world_size, 1,
                                       opts.text_len, fmt::format("the last tenth of --data '{}'", opts.data));
  // A base held in bf16 takes bf16 inputs, as FastVideo casts its batch to the training dtype.
  const auto built_in = plan.find<loom::default_dtype_stage>();
  const at::ScalarType input_dtype = built_in ? loom::scalar_type(built_in->type()) : at::kFloat;
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
          fmt::print("data: {} clips to train on, {} held out, from {}\n\n", clips.size() - held, held, opts.data);
        }
        const double peak = train_options.lr ? train_options.lr->peak : 1e-4;
        // FastVideo's AdamW: betas (0.9, 0.999), eps 1e-8, no weight decay unless it is asked for.
        loom::optim::AdamW optimizer(job.trainable_parameters(), torch::optim::AdamWOptions(peak).weight_decay(0.0));
        const auto [f, h, w] = patches_of(first_clip, model_config);
        // Each rank's share of a micro-batch's tokens: a group of k ranks (sequence_parallel(k),
        // tensor_parallel(k)) shares its clips', 1/k each.
        train_options.tokens_per_micro_batch = opts.batch_per_rank * f * h * w * data.world_size / rt.world_size();
        train_options.name = "wan-finetune";
        // Its schedule on the device the levels are drawn on, and the clips copied there from pinned
        // memory: a step reads nothing on the host.
        const loom::flow_matching method(matching, rt.device());
        const auto loss_of = [&](const latent_clips::batch& clips_of, at::Generator& draws) {
          const loom::flow_matching_inputs inputs =
              method.noise(loom::to_device(clips_of.latents, rt.device(), input_dtype), draws);
          const at::Tensor text = loom::to_device(clips_of.text, rt.device(), input_dtype);
          return loom::flow_matching::loss(job.forward(inputs.noisy, inputs.timesteps, text), inputs);
        };
        const loom::train_result result = loom::train(
            job, optimizer,
            {.loss =
                 [&](std::int64_t step, int micro) {
                   at::Generator draws = loom::step_generator(seed, step, data.rank, micro, rt.device());
                   return loss_of(batches.at((step - 1) * train_options.accumulate + micro), draws);
                 },
             // The same noise and levels at every evaluation: step 0, which no training step is, and
             // each held-out clip's index in place of the rank.
             .eval_loss =
                 [&] {
                   const auto [share, indices] = held_out.held_out_share();
                   at::Tensor sum = at::zeros({}, at::TensorOptions().device(rt.device()));
                   for (std::size_t i = 0; i < indices.size(); ++i) {
                     at::Generator draws = loom::step_generator(seed, 0, static_cast<int>(indices[i]), 0, rt.device());
                     const auto clip = static_cast<std::int64_t>(i);
                     sum += loss_of({share.latents.narrow(0, clip, 1), share.text.narrow(0, clip, 1)}, draws);
                   }
                   return sum / static_cast<double>(indices.size());
                 }},
            train_options);
        if (result.outcome == loom::train_outcome::preempted) return loom::resumable_exit_code;
        recipes::save_adapter_if_adapted(job, plan, train_options.out / "adapter");
        if (opts.merged) {
          const fs::path merged = train_options.out / "merged";
          if (plan.find<loom::lora_stage>()) job.merge();
          job.save_pretrained(merged);  // diffusion_pytorch_model.safetensors and the checkpoint's config.json
          if (rt.rank() == 0) {
            fmt::print("saved {} (diffusers' format: WanTransformer3DModel.from_pretrained)\n", merged.string());
          }
        }
        return 0;
      },
      built);
}

}  // namespace

int main(int argc, char** argv) { return recipes::run_main<options>("wan-finetune", argc, argv, parse, run); }

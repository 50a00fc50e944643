// FastVideo's own example configs for Wan 2.1 T2V (dsl_examples/configs/fastvideo_wan_t2v_lora.yaml and
// fastvideo_wan_t2v.yaml, copied from FastVideo with the checkpoint's path alone changed) read into
// loom's run file key by key, and each FastVideo key loom refuses refused with its sentence
// (docs/run_files.md, "FastVideo's keys").
#include <loom/config/run_file.hpp>
#include <loom/loom.hpp>
#include <models/tiny_gpt.hpp>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

using Catch::Matchers::ContainsSubstring;

namespace {

namespace fs = std::filesystem;

const fs::path configs = fs::path(LOOM_SOURCE_DIR) / "dsl_examples" / "configs";
const fs::path lora_config = configs / "fastvideo_wan_t2v_lora.yaml";
const fs::path full_config = configs / "fastvideo_wan_t2v.yaml";

std::string text_of(const fs::path& file) {
  std::ifstream in(file);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The LoRA config with `from` (which it has) written as `to`, read.
loom::run_file read_edited(const std::string& name, const std::string& from, const std::string& to,
                           const std::vector<std::string>& overrides = {}) {
  std::string text = text_of(lora_config);
  const auto at = text.find(from);
  REQUIRE(at != std::string::npos);
  text.replace(at, from.size(), to);
  const fs::path file = fs::temp_directory_path() / ("loom-test-fastvideo-" + name + ".yaml");
  std::ofstream(file) << text;
  return loom::read_run_file(file, overrides);
}

bool has_note(const loom::run_file& file, const std::string& text) {
  for (const std::string& note : file.notes)
    if (note.find(text) != std::string::npos) return true;
  return false;
}

// What both configs give alike.
void check_common(const loom::run_file& file) {
  // training.data.seed, models.student.init_from, enable_gradient_checkpointing_type: full.
  CHECK(file.stages.stages.find<loom::pretrained_stage>()->path() == "checkpoints/Wan2.1-T2V-1.3B-Diffusers");
  CHECK(file.stages.stages.find<loom::recompute_stage>()->settings().every == 1);
  // hsdp_shard_dim 1: fsdp sharding each copy across one rank.
  REQUIRE(file.stages.strategy.has_value());
  CHECK(std::get<loom::fsdp_stage>(*file.stages.strategy).settings().shard_group_size == 1);
  CHECK_FALSE(file.stages.stages.find<loom::sequence_parallel_stage>().has_value());
  CHECK_FALSE(file.stages.stages.find<loom::tensor_parallel_stage>().has_value());
  // training.optimizer: constant schedule, AdamW's betas and decay.
  REQUIRE(file.train.lr.has_value());
  CHECK(file.train.lr->warmup_steps == 0);
  CHECK(file.train.lr->decay_steps == 0);
  REQUIRE(file.optimizer.has_value());
  CHECK(file.optimizer->beta1 == 0.9);
  CHECK(file.optimizer->beta2 == 0.999);
  CHECK(file.optimizer->eps == 1e-8);
  CHECK(file.optimizer->weight_decay == 0.01);
  // training.data.train_batch_size, training_cfg_rate; training.model leaves FastVideo's defaults.
  REQUIRE(file.data.has_value());
  CHECK(file.data->batch_size == 1);
  REQUIRE(file.flow_matching.has_value());
  CHECK(file.flow_matching->training_cfg_rate == 0.0);
  CHECK(file.flow_matching->weighting_scheme == loom::timestep_density::uniform);
  CHECK(file.flow_matching->flow_shift == 3.0);
  // callbacks.grad_clip.max_grad_norm; callbacks.validation and pipeline.flow_shift.
  CHECK(file.train.clip_norm == 1.0);
  REQUIRE(file.sampling.has_value());
  CHECK(file.sampling->guidance_scale == 5.0);
  CHECK(file.sampling->shift == 3.0);
  CHECK_FALSE(file.ema.has_value());
  // What is read without effect, each said once.
  CHECK(has_note(file, "models.student._target_ (fastvideo.train.models.wan.WanModel) is not read"));
  CHECK(has_note(file, "training.data.dataloader_num_workers"));
  CHECK(has_note(file, "training.data.num_latent_t, num_height, num_width, num_frames are not read"));
  CHECK(has_note(file, "training.tracker is not read"));
  CHECK(has_note(file, "callbacks.validation: pipeline_target, dataset_file are not read"));
  // The stages in an order the rules accept.
  CHECK_NOTHROW(loom::plan_from_file(loom::model<models::TinyGpt>(models::tiny_gpt_config{}), file));
}

}  // namespace

TEST_CASE("FastVideo's Wan 2.1 T2V LoRA config reads key by key", "[run_file][fastvideo]") {
  const loom::run_file file = loom::read_run_file(lora_config);
  check_common(file);
  CHECK(file.stages.stages.find<loom::seeded_stage>()->seed() == 42);
  const auto lora = file.stages.stages.find<loom::lora_stage>();
  REQUIRE(lora.has_value());
  CHECK(lora->rank() == 16);
  CHECK(lora->alpha() == 32.0);
  CHECK(lora->targets() == loom::target_list{"to_q", "to_k", "to_v", "to_out"});
  REQUIRE(file.ranks.has_value());
  CHECK(file.ranks->ranks == 1);
  CHECK(file.train.steps == 10);
  CHECK(file.train.accumulate == 5);
  CHECK(file.train.lr->peak == 1.0e-5);
  CHECK(file.train.out == "outputs/wan_t2v_lora_debug");
  CHECK(file.train.checkpoint_every == 5);
  CHECK(file.train.keep_checkpoints == 2);
  CHECK(file.train.eval_every == 0);
  CHECK(file.data->path == fs::path("data/crush-smol_processed_t2v/combined_parquet_dataset"));
  CHECK(file.sampling->num_inference_steps == 5);
  // resume_from_checkpoint: null, where loom resumes a run folder's latest checkpoint.
  CHECK(has_note(file, "resume_from_checkpoint is null"));
  CHECK(file.notes.size() == 6);
  CHECK_NOTHROW(loom::check_world_size(file, 1));
}

TEST_CASE("FastVideo's Wan 2.1 T2V full fine-tuning config reads key by key", "[run_file][fastvideo]") {
  const loom::run_file file = loom::read_run_file(full_config);
  check_common(file);
  CHECK(file.stages.stages.find<loom::seeded_stage>()->seed() == 1000);
  CHECK_FALSE(file.stages.stages.find<loom::lora_stage>().has_value());
  REQUIRE(file.ranks.has_value());
  CHECK(file.ranks->ranks == 8);  // hsdp_replicate_dim 8 × hsdp_shard_dim 1
  CHECK_THROWS_WITH(loom::check_world_size(file, 2), ContainsSubstring("hsdp_replicate_dim 8 × hsdp_shard_dim 1 asks "
                                                                       "for 8 ranks, but the job has 2"));
  CHECK(file.train.steps == 4000);
  CHECK(file.train.accumulate == 1);
  CHECK(file.train.lr->peak == 1.0e-6);
  CHECK(file.train.out == "outputs/wan_finetune");
  CHECK(file.train.checkpoint_every == 100);
  CHECK(file.train.keep_checkpoints == 3);
  CHECK(file.train.eval_every == 100);
  CHECK(file.data->path == fs::path("data/preprocessed"));
  CHECK(file.sampling->num_inference_steps == 50);
  CHECK_FALSE(has_note(file, "resume_from_checkpoint"));  // latest: what loom does
  CHECK(file.notes.size() == 5);
  // On fewer GPUs, FastVideo's own keys as overrides, and the recipe's folders in loom's.
  const loom::run_file two =
      loom::read_run_file(full_config, std::vector<std::string>{"training.distributed.num_gpus=2",
                                                                "training.distributed.hsdp_replicate_dim=2",
                                                                "pretrained=/models/wan", "data.path=/data/clips"});
  CHECK_NOTHROW(loom::check_world_size(two, 2));
  CHECK(two.stages.stages.find<loom::pretrained_stage>()->path() == "/models/wan");
  CHECK(two.data->path == fs::path("/data/clips"));
}

TEST_CASE("FastVideo's schedules, EMA and clipping map to loom's", "[run_file][fastvideo]") {
  SECTION("linear and cosine decay from the warmup's end to zero at the last step") {
    for (const std::string shape : {"linear", "cosine"}) {
      const loom::run_file file =
          read_edited("schedule-" + shape, "    lr_scheduler: constant\n    lr_warmup_steps: 0\n",
                      "    lr_scheduler: " + shape + "\n    lr_warmup_steps: 2\n");
      CHECK(file.train.lr->warmup_steps == 2);
      CHECK(file.train.lr->decay_steps == 8);
      CHECK(file.train.lr->floor == 0.0);
      CHECK(file.train.lr->decay == (shape == "linear" ? loom::decay_shape::linear : loom::decay_shape::cosine));
    }
  }
  SECTION("constant_with_warmup warms up; constant does not, as FastVideo's, and says so") {
    const loom::run_file warm = read_edited("warmup", "lr_scheduler: constant\n    lr_warmup_steps: 0",
                                            "lr_scheduler: constant_with_warmup\n    lr_warmup_steps: 3");
    CHECK(warm.train.lr->warmup_steps == 3);
    CHECK(warm.train.lr->decay_steps == 0);
    const loom::run_file flat = read_edited("no-warmup", "lr_warmup_steps: 0", "lr_warmup_steps: 3");
    CHECK(flat.train.lr->warmup_steps == 0);
    CHECK(has_note(flat, "lr_warmup_steps (3) is not used under lr_scheduler constant"));
  }
  SECTION("betas as FastVideo's string") {
    const loom::run_file file = read_edited("betas", "betas: [0.9, 0.999]", "betas: \"0.8,0.99\"");
    CHECK(file.optimizer->beta1 == 0.8);
    CHECK(file.optimizer->beta2 == 0.99);
  }
  SECTION("callbacks.ema is loom's ema; an override in FastVideo's spelling reaches it") {
    const loom::run_file file =
        read_edited("ema", "callbacks:\n", "callbacks:\n  ema:\n    decay: 0.999\n    start_iter: 4\n",
                    {"callbacks.ema.decay=0.99"});
    REQUIRE(file.ema.has_value());
    CHECK(file.ema->decay == 0.99);
    CHECK(file.ema->start_step == 4);
  }
  SECTION("max_grad_norm 0 clips nothing") {
    CHECK_FALSE(read_edited("no-clip", "max_grad_norm: 1.0", "max_grad_norm: 0.0").train.clip_norm.has_value());
  }
  SECTION("an out-of-range value names FastVideo's key and line") {
    CHECK_THROWS_WITH(read_edited("steps-0", "max_train_steps: 10", "max_train_steps: 0"),
                      ContainsSubstring("line 53: training.loop.max_train_steps: is 0"));
    CHECK_THROWS_WITH(read_edited("beta", "betas: [0.9, 0.999]", "betas: [0.9, 1.5]"),
                      ContainsSubstring("line 47: training.optimizer.betas: is [0.9,1.5]; give AdamW's two betas, "
                                        "each in [0, 1)"));
    CHECK_THROWS_WITH(read_edited("decay", "weight_decay: 0.01", "weight_decay: -1"),
                      ContainsSubstring("line 48: training.optimizer.weight_decay: is -1; give a non-negative decay"));
  }
}

TEST_CASE("each FastVideo key loom refuses is refused with its sentence", "[run_file][fastvideo]") {
  const auto refused = [](const std::string& name, const std::string& from, const std::string& to,
                          const std::string& message) {
    CAPTURE(name);
    CHECK_THROWS_WITH(read_edited(name, from, to), ContainsSubstring(message));
  };
  refused("method", "finetune.FineTuneMethod", "dmd2.DMD2Method",
          "method._target_: is fastvideo.train.methods.fine_tuning.dmd2.DMD2Method; loom fine-tunes one model by "
          "flow matching, FastVideo's FineTuneMethod; distillation and the other methods are not in loom");
  refused("teacher", "method:\n", "  teacher:\n    init_from: checkpoints/teacher\n    trainable: false\nmethod:\n",
          "models.teacher.init_from: models.student has one too; loom trains one model (no teacher or critic)");
  refused("frozen", "trainable: true", "trainable: false",
          "models.student.trainable: is false; loom trains the model it loads");
  refused("override-weights", "trainable: true", "trainable: true\n    transformer_override_safetensor: w.safetensors",
          "models.student.transformer_override_safetensor: loom loads the weights of init_from's folder alone");
  refused("checkpointing", "enable_gradient_checkpointing_type: full", "enable_gradient_checkpointing_type: ops",
          "training.model.enable_gradient_checkpointing_type: is ops; loom recomputes whole blocks: give full");
  refused("mixed-data", "data_path: data/crush-smol_processed_t2v/combined_parquet_dataset", "data_path: a:2,b",
          "training.data.data_path: give one folder of preprocessed clips, as a string (loom mixes no datasets)");
  refused("data-type", "train_batch_size: 1", "train_batch_size: 1\n    preprocessed_data_type: text_only",
          "training.data.preprocessed_data_type: is text_only; loom trains text-to-video");
  refused("scheduler", "lr_scheduler: constant", "lr_scheduler: cosine_with_restarts",
          "training.optimizer.lr_scheduler: is \"cosine_with_restarts\"; loom's schedule is a warmup, then a linear "
          "or cosine decay");
  refused("betas", "betas: [0.9, 0.999]", "betas: [0.9]",
          "training.optimizer.betas: is [0.9]; give AdamW's two betas, each in [0, 1), e.g. [0.9, 0.999]");
  refused("resume-path", "resume_from_checkpoint: null", "resume_from_checkpoint: outputs/old/checkpoint-5",
          "training.checkpoint.resume_from_checkpoint: is outputs/old/checkpoint-5; loom resumes from the latest "
          "checkpoint in output_dir");
  refused("keep-all", "checkpoints_total_limit: 2", "checkpoints_total_limit: 0",
          "training.checkpoint.checkpoints_total_limit: is 0, FastVideo's \"keep them all\"");
  refused("moba", "enable_gradient_checkpointing_type: full",
          "enable_gradient_checkpointing_type: full\n    moba_config: {moba_chunk_size: 64}",
          "training.model.moba_config: loom has no mixture-of-block attention");
  refused("vsa", "  model:\n", "  vsa:\n    sparsity: 0.9\n  model:\n",
          "training.vsa.sparsity: loom has no video sparse attention");
  refused("precision", "  model:\n", "  dit_precision: bf16\n  model:\n", "training.dit_precision: is bf16");
  refused("clip-target", "grad_clip.GradNormClipCallback", "grad_clip.MyClip",
          "callbacks.grad_clip._target_: is fastvideo.train.callbacks.grad_clip.MyClip; loom clips the gradients' "
          "norm itself");
  refused("callback", "callbacks:\n", "callbacks:\n  profiler: {}\n", "callbacks.profiler: unknown key");
  refused("sampling-steps", "sampling_steps: [5]", "sampling_steps: [5, 10]",
          "callbacks.validation.sampling_steps: give one number of sampling steps, as a list: [50]");
  refused(
      "timesteps", "sampling_steps: [5]", "sampling_steps: [5]\n    sampling_timesteps: [999, 500]",
      "callbacks.validation.sampling_timesteps: loom's sampler spaces its steps as diffusers' Euler scheduler does");
  refused("pipeline", "flow_shift: 3", "flow_shift: 3\n  vae_tiling: true", "pipeline.vae_tiling: unknown key");
  refused("twice", "gradient_accumulation_steps: 5", "gradient_accumulation_steps: 5\n  steps: 20",
          "training.steps: FastVideo's spelling of it is in the file too: give it once");
  refused("seed-twice", "models:\n", "plan:\n  - seeded: 7\nmodels:\n",
          "training.data.seed: sets the plan's seeded stage, which the plan has too: give it once");
}

#!/usr/bin/env python3
"""wan-finetune, the recipe, end to end on a small random Wan that diffusers makes here and clips of
random latents: from a YAML run file in FastVideo's layout, LoRA on FastVideo's default targets
(to_out among them), flow matching with logit-normal timesteps.

- at 1 rank and at 2 (hsdp_shard_dim 2) the loss falls and the validation loss is logged;
- the weights' average (ema, decay 0.9 from step 2) and sampling at each evaluation (the Euler
  sampler, 4 steps, guidance 4 by the negative prompt's states): every evaluation writes the held-out
  clip's sampled latents with their statistics, from fixed noise; --save-ema writes the average's
  adapter (unlike the trained one) and --merged then the average merged in;
- a 2-rank run preempted (SIGTERM to loom-run) and started again ends with the adapter, the
  average's adapter and the last evaluation's samples of an uninterrupted run, byte for byte; the
  adapter names diffusers' to_out.0, and PEFT loads it onto diffusers' model; diffusers' model with
  the merged average gives PEFT's with the average's adapter;
- at 4 ranks, hsdp_replicate_dim 2 × hsdp_shard_dim 2 is fsdp's hybrid sharding in groups of 2;
- sp_size: 2 at 2 ranks is sequence_parallel(2) and trains; an sp_size that does not divide num_gpus and
  sizes whose product is not the world's are refused in one sentence, before the build;
- FastVideo's own example configs (dsl_examples/configs/fastvideo_wan_t2v_lora.yaml, its LoRA debug run
  of 10 steps of 5 micro-batches, and fastvideo_wan_t2v.yaml, full fine-tuning) run with only their
  paths given (the full one also shortened and on 2 ranks), on FastVideo's Parquet dataset
  (make_fastvideo_parquet.py); the LoRA run preempted and resumed ends with an uninterrupted run's
  adapter, byte for byte: the Parquet dataset's position is restored batch for batch.

    wan_finetune_check.py LOOM_RUN WAN_FINETUNE SOURCE_DIR
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from preempted_run import preempted_and_resumed

RUN_FILE = """\
# FastVideo's layout: the model's role with its LoRA block and flow_shift, the parallel sizes under
# training.distributed, the timestep density under training.model.
plan:
  - seeded: 5
  - pretrained: {model}
models:
  transformer:
    flow_shift: 3.0
    lora:
      enable: true
      rank: 4
      alpha: 8
      target_modules: [to_q, to_k, to_v, to_out]
training:
  distributed:
{distributed}
  model:
    weighting_scheme: logit_normal
    logit_std: 1.0
  steps: {steps}
  checkpoint_every: 100
  eval_every: 4
  log_every: 1
  lr: {{peak: 2e-2, warmup_steps: 1, decay_steps: {decay}, decay: cosine}}
ema:
  decay: 0.9
  start_step: 2
sampling:
  num_inference_steps: 4
  guidance_scale: 4.0
"""


def distributed(replicas: int, shard: int, sp: int = 1) -> str:
    return (f"    num_gpus: {replicas * shard}\n    sp_size: {sp}\n    hsdp_replicate_dim: {replicas}\n"
            f"    hsdp_shard_dim: {shard}")


def losses(out: Path, key: str) -> list[float]:
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [line[key] for line in lines if key in line]


def sampled(out: Path, ranks: int) -> list[str]:
    """What went wrong with the samples of the held-out clip (the first held out, the last of 10) at steps 4, 8
    and 12."""
    from safetensors import safe_open

    failures, samples = [], []
    for step in (4, 8, 12):
        folder = out / "validation" / f"step-{step:08d}"
        files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
        if [f.name for f in files] != ["clip-0000.safetensors"]:
            failures.append(f"at {ranks} rank(s) step {step} sampled {[f.name for f in files]}, not the held-out clip")
            continue
        with safe_open(files[0], "pt") as f:
            latents, stats = f.get_tensor("latents"), f.metadata()
        if list(latents.shape) != [1, 16, 3, 8, 8] or not all(k in stats for k in ("mean", "std", "min", "max")):
            failures.append(f"at {ranks} rank(s) step {step}: latents {list(latents.shape)}, statistics {stats}")
        elif abs(float(stats["mean"]) - latents.mean().item()) > 1e-4 * (1 + abs(latents.mean().item())):
            failures.append(f"at {ranks} rank(s) step {step}: the recorded mean {stats['mean']} is not the latents'")
        samples.append(latents)
    if len(samples) == 3 and (samples[0].equal(samples[1]) or samples[1].equal(samples[2])):
        failures.append(f"at {ranks} rank(s) the samples did not change as the model trained")
    return failures


def fastvideo_configs(loom_run: str, recipe: str, source: Path, root: Path, model: Path) -> list[str]:
    """FastVideo's example configs on its Parquet format, as the docstring says."""
    failures = []
    parquet = root / "parquet"
    subprocess.run([sys.executable, source / "dsl_examples" / "data" / "make_fastvideo_parquet.py", parquet,
                    "--clips", "20", "--rows-per-file", "4", "--text-dim", "32", "--max-tokens", "6"], check=True)
    configs = source / "dsl_examples" / "configs"

    def command(config: str, out: Path, ranks: int = 1, *extra: str) -> list[str]:
        return [loom_run, "--nproc-per-node", str(ranks), "--", recipe, "--config", str(configs / config),
                f"--models.student.init_from={model}", f"--training.data.data_path={parquet}",
                f"--training.checkpoint.output_dir={out}", "--text-len", "8", *extra]

    lora = root / "fastvideo-lora"
    done = subprocess.run(command("fastvideo_wan_t2v_lora.yaml", lora), capture_output=True, text=True)
    train = losses(lora, "loss") if done.returncode == 0 else []
    if (done.returncode != 0 or "FastVideo's Parquet dataset" not in done.stdout
            or "finished steps 1 … 10 of 10" not in done.stdout or not (lora / "adapter").is_dir()):
        failures.append(f"FastVideo's LoRA example did not train its 10 steps on the Parquet dataset: "
                        f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
    else:
        print(f"FastVideo's t2v_lora.yaml: 10 steps of 5 micro-batches, loss {train[0]:.3f} -> {train[-1]:.3f}")
        resumed = root / "fastvideo-lora-preempted"
        failures += preempted_and_resumed(command("fastvideo_wan_t2v_lora.yaml", resumed), r"wan-finetune step +1/10",
                                          resumed, lora)
    full = root / "fastvideo-full"
    done = subprocess.run(command("fastvideo_wan_t2v.yaml", full, 2, "--training.loop.max_train_steps=3",
                                  "--training.distributed.num_gpus=2", "--training.distributed.hsdp_replicate_dim=2"),
                          capture_output=True, text=True)
    if done.returncode != 0 or "finished steps 1 … 3 of 3" not in done.stdout or "weight_decay=0.01)" not in done.stdout:
        failures.append(f"FastVideo's full fine-tuning example did not train 3 steps at 2 ranks: "
                        f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return failures


def main() -> int:
    loom_run, recipe, source = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    data = source / "dsl_examples" / "data"
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="loom-wan-finetune-") as scratch:
        root = Path(scratch)
        model, clips = root / "model", root / "clips"
        subprocess.run([sys.executable, data / "make_wan.py", model, "--text-dim", "32"], check=True)
        subprocess.run([sys.executable, data / "make_wan_latents.py", clips, "--text-dim", "32", "--clips", "10",
                        "--max-tokens", "6"], check=True)
        negative = root / "negative.safetensors"
        subprocess.run([sys.executable, data / "make_wan_latents.py", root / "negative", "--text-dim", "32",
                        "--clips", "1", "--max-tokens", "6", "--seed", "9"], check=True)
        (root / "negative" / "clip-00000.safetensors").rename(negative)

        def command(ranks: int, replicas: int, shard: int, out: Path, steps: int = 12, sp: int = 1,
                    *extra: str) -> list[str]:
            config = out.with_suffix(".yaml")
            config.write_text(RUN_FILE.format(model=model, distributed=distributed(replicas, shard, sp), steps=steps,
                                              decay=steps - 1))
            return [loom_run, "--nproc-per-node", str(ranks), "--", recipe, "--config", str(config), "--data",
                    str(clips), "--text-len", "8", "--negative-text", str(negative), f"--train.out={out}", *extra]

        for ranks, shard in ((1, 1), (2, 2)):
            out = root / f"straight-{ranks}"
            merged = ("--merged", "--save-ema") if ranks == 2 else ()
            done = subprocess.run(command(ranks, 1, shard, out, 12, 1, *merged), capture_output=True, text=True)
            if done.returncode != 0:
                print(done.stdout[-3000:], done.stderr[-3000:])
                return 1
            train, held_out = losses(out, "loss"), losses(out, "eval_loss")
            print(f"{ranks} rank(s): loss {train[0]:.3f} -> {train[-1]:.3f}, validation {held_out}")
            if sum(train[-4:]) >= sum(train[:4]):
                failures.append(f"at {ranks} rank(s) the loss did not fall: {train}")
            if len(held_out) != 3 or held_out[-1] >= held_out[0]:
                failures.append(f"at {ranks} rank(s) the validation loss was not logged at 4, 8, 12 or did not "
                                f"fall: {held_out}")
            for expected in ("lora(rank=4, alpha=8", f"shard_group_size={shard}", "weighting_scheme=logit_normal",
                             "flow_shift=3", "lora adapted 16 layers", "ema: decay=0.9, start_step=2",
                             "sampling at each evaluation: num_inference_steps=4, shift=3, guidance_scale=4"):
                if expected not in done.stdout:
                    failures.append(f"at {ranks} rank(s) the run did not say '{expected}':\n{done.stdout[:2000]}")
            failures += sampled(out, ranks)

        straight, preempted = root / "straight-2", root / "preempted"
        failures += preempted_and_resumed(
            command(2, 1, 2, preempted, 12, 1, "--merged", "--save-ema"), r"wan-finetune step +3/12", preempted,
            straight, same=("adapter/adapter_model.safetensors", "adapter/adapter_config.json",
                            "adapter-ema/adapter_model.safetensors", "validation/step-00000012/clip-0000.safetensors"))
        if losses(straight, "eval_loss")[-1] != losses(preempted, "eval_loss")[-1]:
            failures.append("the resumed run's last validation loss differs from the uninterrupted run's")

        import torch
        from diffusers import WanTransformer3DModel
        from peft import PeftModel
        from safetensors.torch import load_file

        names = load_file(straight / "adapter" / "adapter_model.safetensors").keys()
        if "base_model.model.blocks.0.attn1.to_out.0.lora_A.weight" not in names:
            failures.append(f"the adapter does not name diffusers' to_out.0: {sorted(names)[:6]}")
        base = WanTransformer3DModel.from_pretrained(model).eval()
        generator = torch.Generator().manual_seed(3)
        inputs = dict(hidden_states=torch.randn(1, 16, 3, 8, 8, generator=generator), timestep=torch.tensor([500]),
                      encoder_hidden_states=torch.randn(1, 8, 32, generator=generator), return_dict=False)
        with torch.no_grad():
            before = base(**inputs)[0]
            adapted = PeftModel.from_pretrained(base, straight / "adapter").eval()
            after = adapted(**inputs)[0]
        if (after - before).abs().max().item() <= 1e-4 * before.abs().max().item():
            failures.append("PEFT's model with the adapter gives the base model's velocity")
        # --save-ema: the average's adapter, which lags the trained one; with --merged, the average
        # folded in, a plain model for diffusers.
        trained = load_file(straight / "adapter" / "adapter_model.safetensors")
        averaged = load_file(straight / "adapter-ema" / "adapter_model.safetensors")
        if trained.keys() != averaged.keys() or all(torch.equal(trained[k], averaged[k]) for k in trained):
            failures.append("the average's adapter is not an adapter of the same tensors with other values")
        if (straight / "merged").exists():
            failures.append("--save-ema --merged wrote merged/ beside merged-ema/")
        with torch.no_grad():
            base = WanTransformer3DModel.from_pretrained(model).eval()
            averaged_model = PeftModel.from_pretrained(base, straight / "adapter-ema").eval()
            averaged_after = averaged_model(**inputs)[0]
            folded = WanTransformer3DModel.from_pretrained(straight / "merged-ema").eval()(**inputs)[0]
        difference = (folded - averaged_after).abs().max().item()
        print(f"diffusers with the merged average against PEFT with the average's adapter: {difference:.2e}")
        if difference > 1e-5 * averaged_after.abs().max().item():
            failures.append(f"wan-finetune --merged --save-ema's weights and PEFT with adapter-ema differ by "
                            f"{difference}")

        hybrid = root / "hybrid"
        done = subprocess.run(command(4, 2, 2, hybrid, 4), capture_output=True, text=True)
        if done.returncode != 0 or "shard_group_size=2" not in done.stdout or not (hybrid / "adapter").is_dir():
            failures.append(f"hsdp_replicate_dim 2 × hsdp_shard_dim 2 did not train at 4 ranks: "
                            f"{done.stdout[-1500:]}{done.stderr[-1500:]}")

        split = root / "sp"
        done = subprocess.run(command(2, 1, 2, split, sp=2), capture_output=True, text=True)
        split_train = losses(split, "loss") if done.returncode == 0 else []
        if (done.returncode != 0 or "sequence_parallel(size=2)" not in done.stdout
                or "sequence parallel: 2 ranks a sequence" not in done.stdout or not (split / "adapter").is_dir()
                or sum(split_train[-4:]) >= sum(split_train[:4])):
            failures.append(f"sp_size: 2 did not train at 2 ranks, its loss falling: {split_train} "
                            f"{done.stdout[-1500:]}{done.stderr[-1500:]}")
        else:
            print(f"sp_size 2 at 2 ranks: loss {split_train[0]:.3f} -> {split_train[-1]:.3f}")

        failures += fastvideo_configs(loom_run, recipe, source, root, model)

        refusals = {
            "a group that does not divide the world": (
                command(3, 1, 3, root / "sp3", sp=2),
                "training.distributed.sp_size: is 2, which does not divide num_gpus 3"),
            "the world's size": (command(2, 2, 2, root / "sizes"),
                                 "training.distributed: hsdp_replicate_dim 2 × hsdp_shard_dim 2 asks for 4 ranks, but "
                                 "the job has 2: launch 4 ranks, or make hsdp_replicate_dim × hsdp_shard_dim 2"),
        }
        for what, (refused_command, sentence) in refusals.items():
            refused = subprocess.run(refused_command, capture_output=True, text=True)
            if refused.returncode == 0 or sentence not in refused.stderr or "build:" in refused.stdout:
                failures.append(f"{what} was not refused in one sentence before the build: "
                                f"{refused.stdout[-800:]}{refused.stderr[-800:]}")
    for failure in failures:
        print("FAIL:", failure)
    print("wan-finetune:", "ok" if not failures else f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

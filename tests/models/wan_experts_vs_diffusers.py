#!/usr/bin/env python3
"""loom::models::WanExperts (Wan 2.2 T2V-A14B's two experts) against diffusers' WanPipeline, on a
pipeline folder nobody here wrote: WanPipeline.save_pretrained of two random WanTransformer3DModel of
one small config with different weights, boundary_ratio 0.875 and a FlowMatchEulerDiscreteScheduler
(no text encoder, no VAE: the experts are what loom reads). loom reads it with pretrained(folder).

- For timesteps above the boundary (875), below it, at it, one fp32 step below it, and one a token
  ([batch, patches]) on either side, loom's velocity must equal that of the transformer WanPipeline
  takes (`transformer` where t >= boundary_ratio · num_train_timesteps, compared in fp32, else
  `transformer_2`) within 1e-5 of its largest magnitude (fp32), under local() and fsdp() at 1 rank
  and fsdp() at 2 (each rank reading its share of each expert); the explicit expert's velocity must equal the
  timestep's choice bit for bit; timesteps on both sides of the boundary are refused with the sentence
  that says to give the expert. At 2 ranks ddp() and tensor_parallel(2) must be refused; at 1 a folder
  without boundary_ratio, with a ratio of 1, or without transformer_2/, each in its sentence.
- LoRA (to_q, to_k, to_v, to_out.0, alpha 8) on both experts, a few SGD steps under local(), saved
  with save_adapter in diffusers' format (one folder an expert) and PEFT's: the pipeline loads both
  adapters (load_lora_weights(folder, subfolder="transformer"), and subfolder="transformer_2" with
  load_into_transformer_2=True), PEFT each expert's folder, and each gives loom's adapted velocity
  within 1e-5 of its largest magnitude, with no warning; each expert's adapted velocity must move
  from its base model's. loom itself loads both back bit for bit (the program checks that). The merged
  model, saved with save_pretrained as a pipeline's folder (an expert a folder), loads with
  WanPipeline.from_pretrained and gives loom's merged velocities; the pipeline's VAE, which loom does
  not train, is carried over whole and loads equal.

    wan_experts_vs_diffusers.py --loom-run L --program P --ranks N
    wan_experts_vs_diffusers.py make FOLDER      (the pipeline folder alone)
"""
from __future__ import annotations

import logging
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

from loom_runs import LoomRuns, driver_arguments

from wan_adapters_vs_diffusers import WarningsSeen
from wan_vs_diffusers import random_wan

CONFIG = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4,
              text_dim=16, freq_dim=16, ffn_dim=32, num_layers=2, cross_attn_norm=True, rope_max_seq_len=16)
BATCH, GRID, TEXT_LENGTH = 2, (3, 4, 4), 5
PATCHES = GRID[0] * (GRID[1] // 2) * (GRID[2] // 2)
BOUNDARY_RATIO = 0.875
NUM_TRAIN_TIMESTEPS = 1000
FP32_TOLERANCE = 1e-5
# How much further from the base model than the bound each adapted expert's velocity must be.
ADAPTED_MARGIN = 100
LORA_OUT = "lora-out"


def cases():
    """Each case's timesteps: one a sample, or one a token, all on one side of the boundary."""
    import torch

    boundary = torch.tensor(BOUNDARY_RATIO * NUM_TRAIN_TIMESTEPS, dtype=torch.float32)
    just_below = torch.nextafter(boundary, torch.tensor(0.0)).item()
    token_steps = torch.linspace(0, 1, PATCHES)
    return {
        "high-noise": torch.tensor([950.0, 875.5]),
        "low-noise": torch.tensor([874.0, 10.0]),
        "at-the-boundary": torch.tensor([875.0, 875.0]),
        "one-step-below": torch.tensor([just_below, 500.0]),
        "per-token-high-noise": torch.stack([900 + 50 * token_steps, 880 + 100 * token_steps]),
        "per-token-low-noise": torch.stack([800 * token_steps, just_below * token_steps.flip(0)]),
    }


def mixed_cases():
    """Timesteps on both sides of the boundary, which loom refuses to choose an expert for."""
    import torch

    per_token = torch.full((BATCH, PATCHES), 900.0)
    per_token[1, 3] = 100.0
    return {"samples": torch.tensor([900.0, 100.0]), "tokens": per_token}


def tiny_vae():
    """A random AutoencoderKLWan of a few thousand weights: a component the pipeline holds and loom does not
    train, which a merged pipeline must carry over."""
    import torch
    from diffusers import AutoencoderKLWan

    torch.manual_seed(402)
    return AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 1], num_res_blocks=1, attn_scales=[],
                            temperal_downsample=[False])


def wan_pipeline(folder: Path | None = None):
    """The pipeline, with two random experts (written to `folder` by save_pretrained when given)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline

    pipeline = WanPipeline(tokenizer=None, text_encoder=None, vae=tiny_vae(),
                           scheduler=FlowMatchEulerDiscreteScheduler(shift=5.0,
                                                                     num_train_timesteps=NUM_TRAIN_TIMESTEPS),
                           transformer=random_wan(CONFIG, 400), transformer_2=random_wan(CONFIG, 401),
                           boundary_ratio=BOUNDARY_RATIO)
    if folder is not None:
        pipeline.save_pretrained(folder)
    return pipeline


def load_pipeline(folder: Path):
    """The saved pipeline as a user loads it (WanPipeline.from_pretrained), its text encoder and
    tokenizer none, its VAE the folder's."""
    from diffusers import WanPipeline

    return WanPipeline.from_pretrained(folder, tokenizer=None, text_encoder=None)


def chosen(pipeline, timestep):
    """The transformer WanPipeline's loop takes at `timestep` (its scheduler's fp32 t against the float
    boundary_timestep), and its index: 0 for transformer, 1 for transformer_2."""
    boundary_timestep = pipeline.config.boundary_ratio * pipeline.scheduler.config.num_train_timesteps
    high = bool((timestep.float() >= boundary_timestep).all())
    return (pipeline.transformer, 0) if high else (pipeline.transformer_2, 1)


def make(folder: Path) -> None:
    import torch
    from safetensors.torch import save_file

    wan_pipeline(folder)
    pipeline = load_pipeline(folder)  # what loom reads, read by diffusers
    inputs = torch.Generator().manual_seed(17)
    latents = torch.randn(BATCH, CONFIG["in_channels"], *GRID, generator=inputs)
    text = torch.randn(BATCH, TEXT_LENGTH, CONFIG["text_dim"], generator=inputs)
    tensors = {"latents": latents, "text": text}
    for name, timestep in cases().items():
        model, index = chosen(pipeline, timestep)
        other = pipeline.transformer_2 if index == 0 else pipeline.transformer
        with torch.no_grad():
            output = model(latents, timestep, text, return_dict=False)[0]
            others = other(latents, timestep, text, return_dict=False)[0]
        # Taking the other expert must fail the comparison by far.
        if (output - others).abs().max() < 100 * FP32_TOLERANCE * output.abs().max():
            sys.exit(f"FAILED: the two experts agree on {name}: a wrong choice would pass")
        tensors.update({f"timestep/{name}": timestep, f"output/{name}": output.contiguous(),
                        f"expert/{name}": torch.tensor(index)})
    tensors.update({f"mixed/{name}": timestep for name, timestep in mixed_cases().items()})
    save_file(tensors, str(folder / "expected.safetensors"))


def compare_adapters(folder: Path, out: Path) -> list[str]:
    """What diffusers and PEFT compute with loom's adapter folders, against loom's velocities; the failures."""
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file

    expected = load_file(str(folder / "expected.safetensors"))
    loom = load_file(str(out / "outputs.safetensors"))

    def through_pipeline():
        pipeline = load_pipeline(folder)
        pipeline.load_lora_weights(str(out / "diffusers"), subfolder="transformer", adapter_name="loom")
        pipeline.load_lora_weights(str(out / "diffusers"), subfolder="transformer_2", adapter_name="loom",
                                   load_into_transformer_2=True)
        for model in (pipeline.transformer, pipeline.transformer_2):
            config = model.peft_config["loom"]
            if (config.r, config.lora_alpha) != (4, 8):
                raise AssertionError(f"diffusers built r {config.r}, lora_alpha {config.lora_alpha}, not the "
                                     "file's 4 and 8")
        return pipeline

    def through_peft():
        pipeline = load_pipeline(folder)
        pipeline.transformer = PeftModel.from_pretrained(pipeline.transformer, out / "peft" / "transformer")
        pipeline.transformer_2 = PeftModel.from_pretrained(pipeline.transformer_2, out / "peft" / "transformer_2")
        return pipeline

    failures = []
    seen = WarningsSeen()
    for name in ("diffusers", "peft"):
        logging.getLogger(name).addHandler(seen)
    base = load_pipeline(folder)
    loads = {"diffusers' folders, WanPipeline.load_lora_weights": (through_pipeline, "adapted"),
             "PEFT's folders, PeftModel.from_pretrained": (through_peft, "adapted"),
             "merged, WanPipeline.from_pretrained": (lambda: load_pipeline(out / "merged"), "merged")}
    for what, (load, kind) in loads.items():
        seen.seen.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            pipeline = load()
        for name, timestep in cases().items():
            model, _ = chosen(pipeline, timestep)
            with torch.no_grad():
                output = model.eval()(expected["latents"], timestep, expected["text"], return_dict=False)[0]
            reference = loom[f"{kind}/{name}"]
            difference = (output - reference).abs().max().item()
            allowed = FP32_TOLERANCE * reference.abs().max().item()
            within = difference <= allowed
            print(f"{what}, {name}: largest difference from loom's {kind} velocity {difference:.2e}: "
                  f"{'within' if within else 'BEYOND'} {allowed:.2e}")
            if not within:
                failures.append(f"{what}, {name}")
        if seen.seen:
            failures.append(f"{what} warned: " + "; ".join(seen.seen))
    merged_vae = load_pipeline(out / "merged").vae.state_dict()
    if merged_vae.keys() != base.vae.state_dict().keys() or not all(
            torch.equal(merged_vae[k], v) for k, v in base.vae.state_dict().items()):
        failures.append("the merged pipeline's VAE is not the pipeline's")
    else:
        print(f"merged, WanPipeline.from_pretrained: the VAE is the pipeline's ({len(merged_vae)} tensors, equal)")
    for name in ("high-noise", "low-noise"):
        timestep = cases()[name]
        model, _ = chosen(base, timestep)
        with torch.no_grad():
            unadapted = model.eval()(expected["latents"], timestep, expected["text"], return_dict=False)[0]
        adapted = loom[f"adapted/{name}"]
        moved = (adapted - unadapted).abs().max().item()
        needed = ADAPTED_MARGIN * FP32_TOLERANCE * adapted.abs().max().item()
        print(f"loom's adapted velocity, {name}, against the base expert's: largest difference {moved:.2e} "
              f"({'at least' if moved >= needed else 'LESS THAN'} {needed:.2e})")
        if moved < needed:
            failures.append(f"the adapter barely changes the {name} expert's velocity")
    return failures


def refusals(args, scratch: Path, folder: Path) -> list[str]:
    """Pipeline folders loom must refuse, each with its sentence: the failures."""
    import json
    import shutil

    def changed_index(**keys):
        def change(copy: Path) -> None:
            index = json.loads((copy / "model_index.json").read_text())
            index.update(keys)
            (copy / "model_index.json").write_text(json.dumps(index))
        return change

    cases = {
        "no-boundary-ratio": (changed_index(boundary_ratio=None), "this is a pipeline of one transformer"),
        "ratio-of-one": (changed_index(boundary_ratio=1.0), "outside (0, 1)"),
        "no-transformer_2": (lambda copy: shutil.rmtree(copy / "transformer_2"), "transformer_2' cannot be read"),
    }
    failures = []
    for name, (change, sentence) in cases.items():
        copy = scratch / name
        shutil.copytree(folder, copy)
        change(copy)
        done = subprocess.run([args.loom_run, "--nproc-per-node", "1", "--", args.program, str(copy), "local"],
                              timeout=120, capture_output=True, text=True)
        said = done.stdout + done.stderr
        refused = done.returncode != 0 and sentence in said
        print(f"{name}: {'refused' if refused else 'NOT refused as expected'}: "
              + next((line for line in said.splitlines() if "loom:" in line), said.strip()[-300:]))
        if not refused:
            failures.append(f"{name} not refused with '{sentence}'")
    return failures


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        make(Path(sys.argv[2]))
        return
    args = driver_arguments()
    with tempfile.TemporaryDirectory(prefix="loom-wan-experts-") as scratch:
        folder = Path(scratch) / "pipeline"
        make(folder)
        loom = LoomRuns(args)
        if args.ranks == 1:
            loom(folder, "local")
        loom(folder, "fsdp")
        if args.ranks == 1:
            out = Path(scratch) / LORA_OUT
            if loom(folder, "lora", str(out)):
                loom.failures += compare_adapters(folder, out)
            loom.failures += refusals(args, Path(scratch), folder)
        else:
            loom(folder, "refusals")
        if loom.failures:
            sys.exit("FAILED: " + "; ".join(loom.failures))
    print(f"loom's WanExperts gives the velocity of the expert diffusers' WanPipeline takes at {args.ranks} rank(s)"
          + (", and diffusers and PEFT load its adapters" if args.ranks == 1 else ""))


if __name__ == "__main__":
    main()

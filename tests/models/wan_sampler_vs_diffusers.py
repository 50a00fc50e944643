#!/usr/bin/env python3
"""loom's Euler flow-matching sampler (loom::flow_euler_sampler) against diffusers' loop: WanPipeline's
denoising loop over FlowMatchEulerDiscreteScheduler(shift).set_timesteps(steps), with classifier-free
guidance by a negative prompt's text states, on a small random diffusers Wan.

- Bit for bit over the same model: diffusers' loop is replayed over loom's model, each call answered
  with what loom's Wan answered loom's sampler, after checking that diffusers asks it the same thing
  (latents, timesteps and which text, bit for bit); diffusers' latents must then be loom's, bit for
  bit. In fp32, and with a model that takes and gives bf16 (the scheduler's casts).
- Over each side's own model: loom's latents within fp32 rounding of diffusers' own loop over
  WanTransformer3DModel, under local() at 1 rank and ddp() and fsdp() at 2 (the model's sharding
  changes its rounding; the loop stays bit for bit).
- Two experts (Wan 2.2 A14B's pipeline of transformer and transformer_2, loom::models::WanExperts):
  the steps at or above the boundary guided by guidance_scale, the low-noise expert's below it by
  guidance_scale_2 (a different scale, so one scale for both fails): replayed bit for bit as above,
  and within fp32 rounding of WanPipeline.__call__ itself on the saved pipeline (output_type
  "latent"), under local() at 1 rank and fsdp() at 2 (ddp() refuses a model of branches).

    wan_sampler_vs_diffusers.py --loom-run L --program P --ranks N
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from loom_runs import LoomRuns, driver_arguments, strategies
from wan_vs_diffusers import random_wan

CONFIG = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
              text_dim=16, freq_dim=16, ffn_dim=32, num_layers=2, cross_attn_norm=True, rope_max_seq_len=32)
STEPS, SHIFT, GUIDANCE = 7, 3.0, 5.0
# Two experts: the timesteps 1000, 937.7 and 857.7 are transformer's, the 4 below transformer_2's.
BOUNDARY_RATIO, GUIDANCE_2 = 0.8, 2.0
GRID = (3, 6, 6)  # latent frames, height, width: WanPipeline's num_frames 9, height and width 48
# The latents after 7 steps of each side's own model: their difference relative to their largest magnitude.
FP32_TOLERANCE = 1e-4


def make(folder: Path, experts: bool) -> None:
    """A transformer's folder, or with `experts` a pipeline's of two (different random weights), and the
    sampler's inputs."""
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline
    from safetensors.torch import save_file

    if experts:
        WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=FlowMatchEulerDiscreteScheduler(shift=SHIFT),
                    transformer=random_wan(CONFIG, 311), transformer_2=random_wan(CONFIG, 312),
                    boundary_ratio=BOUNDARY_RATIO).save_pretrained(folder)
    else:
        random_wan(CONFIG, 311).save_pretrained(folder)
    g = torch.Generator().manual_seed(5)
    settings = [STEPS, SHIFT, GUIDANCE, GUIDANCE_2, BOUNDARY_RATIO] if experts else [STEPS, SHIFT, GUIDANCE, 0, 0]
    save_file({"noise": torch.randn(1, 4, *GRID, generator=g), "text": torch.randn(1, 7, 16, generator=g),
               "negative": torch.randn(1, 7, 16, generator=g),
               "settings": torch.tensor(settings, dtype=torch.float64)},
              str(folder / "inputs.safetensors"))


def diffusers_loop(model, inputs: dict, dtype, experts: bool):
    """WanPipeline.__call__'s loop (diffusers/pipelines/wan/pipeline_wan.py): Wan 2.1's branch, or with
    `experts` Wan 2.2's, whose steps below the boundary are guided by guidance_scale_2."""
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler(shift=SHIFT)
    scheduler.set_timesteps(STEPS)
    scheduler.set_begin_index(0)
    boundary_timestep = BOUNDARY_RATIO * scheduler.config.num_train_timesteps if experts else None
    latents = inputs["noise"].clone()
    for t in scheduler.timesteps:
        scale = GUIDANCE if boundary_timestep is None or t >= boundary_timestep else GUIDANCE_2
        latent_model_input = latents.to(dtype)
        timestep = t.expand(latents.shape[0])
        noise_pred = model(latent_model_input, timestep, inputs["text"], False)
        noise_uncond = model(latent_model_input, timestep, inputs["negative"], True)
        noise_pred = noise_uncond + scale * (noise_pred - noise_uncond)
        latents = scheduler.step(noise_pred, t, latents, return_dict=False)[0]
    return latents


def diffusers_latents(folder: Path, inputs: dict, experts: bool):
    """What diffusers itself samples in fp32: its loop over WanTransformer3DModel, or for two experts
    WanPipeline.__call__ on the saved pipeline."""
    import torch
    from diffusers import WanPipeline, WanTransformer3DModel

    with torch.no_grad():
        if not experts:
            model = WanTransformer3DModel.from_pretrained(folder).eval()
            return diffusers_loop(lambda x, t, text, _: model(x, t, text, return_dict=False)[0], inputs, torch.float32,
                                  experts)
        pipeline = WanPipeline.from_pretrained(folder, tokenizer=None, text_encoder=None, vae=None)
        frames, height, width = GRID
        return pipeline(prompt_embeds=inputs["text"], negative_prompt_embeds=inputs["negative"],
                        latents=inputs["noise"].clone(), num_inference_steps=STEPS, guidance_scale=GUIDANCE,
                        guidance_scale_2=GUIDANCE_2, num_frames=(frames - 1) * 4 + 1, height=height * 8,
                        width=width * 8, output_type="latent").frames


class Replay:
    """loom's Wan as loom's sampler saw it: each call checked against the recorded one, then answered."""

    def __init__(self, recorded: dict):
        self.recorded, self.calls, self.problems = recorded, 0, []

    def __call__(self, x, t, text, negative: bool):
        import torch

        call = f"call.{self.calls}."
        self.calls += 1
        if call + "x" not in self.recorded:
            self.problems.append(f"diffusers makes more than loom's {self.calls - 1} model calls")
            return torch.zeros_like(x)
        for what, theirs, ours in (("latents", x, self.recorded[call + "x"]), ("timestep", t, self.recorded[call + "t"])):
            if theirs.dtype != ours.dtype or not torch.equal(theirs, ours):
                self.problems.append(f"{call[:-1]}: diffusers' {what} ({theirs.dtype}) differ from loom's ({ours.dtype})")
        if bool(self.recorded[call + "negative"].item()) != negative:
            self.problems.append(f"{call[:-1]}: the text is {'not ' if negative else ''}the negative prompt's in diffusers")
        return self.recorded[call + "velocity"]


def check_run(out: Path, folder: Path, experts: bool, bf16_io: bool, failures: list[str], what: str) -> None:
    import torch
    from safetensors.torch import load_file

    inputs = load_file(str(folder / "inputs.safetensors"))
    recorded = load_file(str(out))
    replay = Replay(recorded)
    replayed = diffusers_loop(replay, inputs, torch.bfloat16 if bf16_io else torch.float32, experts)
    if replay.calls != STEPS * 2 or f"call.{replay.calls}.x" in recorded:
        replay.problems.append(f"diffusers made {replay.calls} model calls, loom {sum(k.endswith('.x') for k in recorded)}")
    ours = recorded["latents"]
    if replayed.dtype != ours.dtype or not torch.equal(replayed, ours):
        replay.problems.append(f"diffusers' latents ({replayed.dtype}) differ from loom's ({ours.dtype}) over the same "
                               f"model by {(replayed.float() - ours.float()).abs().max().item():.3e}")
    print(f"{what}: diffusers' loop over loom's model: {replay.calls} calls, "
          f"{'bit for bit' if not replay.problems else '; '.join(replay.problems)}")
    failures.extend(f"{what}: {problem}" for problem in replay.problems)
    if bf16_io:
        return
    theirs = diffusers_latents(folder, inputs, experts)
    difference = (theirs - ours).abs().max().item() / theirs.abs().max().item()
    within = difference <= FP32_TOLERANCE
    own = "WanPipeline on the two experts" if experts else "diffusers' own loop over WanTransformer3DModel"
    print(f"{what}: against {own}: {difference:.2e} of the largest value: "
          f"{'within' if within else 'BEYOND'} {FP32_TOLERANCE:.0e}")
    if not within:
        failures.append(f"{what}: {difference:.2e} from diffusers' own loop")


def main() -> None:
    args = driver_arguments()
    with tempfile.TemporaryDirectory(prefix="loom-sampler-") as scratch:
        loom = LoomRuns(args)
        failures: list[str] = []
        for experts in (False, True):
            folder = Path(scratch) / ("wan-experts" if experts else "wan")
            make(folder, experts)
            for strategy in strategies(args.ranks):
                if experts and strategy == "ddp":
                    continue
                for bf16_io in (False, True):
                    what = f"{'two experts ' if experts else ''}{strategy}{' bf16 io' if bf16_io else ''}"
                    out = Path(scratch) / f"{what.replace(' ', '-')}.safetensors"
                    if loom(folder, strategy, str(out), *(["--bf16-io"] if bf16_io else [])):
                        check_run(out, folder, experts, bf16_io, failures, what)
        failures += loom.failures
        if failures:
            sys.exit("FAILED: " + "; ".join(failures))
    print(f"loom's Euler sampler is diffusers' loop at {args.ranks} rank(s), over one model and two experts: bit for "
          "bit over the same model, within fp32 rounding over each side's own")


if __name__ == "__main__":
    main()

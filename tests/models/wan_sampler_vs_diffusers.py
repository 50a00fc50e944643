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
# The latents after 7 steps of each side's own model: their difference relative to their largest magnitude.
FP32_TOLERANCE = 1e-4


def make(folder: Path) -> None:
    import torch
    from safetensors.torch import save_file

    random_wan(CONFIG, 311).save_pretrained(folder)
    g = torch.Generator().manual_seed(5)
    save_file({"noise": torch.randn(1, 4, 3, 6, 6, generator=g), "text": torch.randn(1, 7, 16, generator=g),
               "negative": torch.randn(1, 7, 16, generator=g),
               "settings": torch.tensor([STEPS, SHIFT, GUIDANCE], dtype=torch.float64)},
              str(folder / "inputs.safetensors"))


def diffusers_loop(model, inputs: dict, dtype):
    """WanPipeline.__call__'s loop (diffusers/pipelines/wan/pipeline_wan.py), Wan 2.1's branch."""
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler(shift=SHIFT)
    scheduler.set_timesteps(STEPS)
    scheduler.set_begin_index(0)
    latents = inputs["noise"].clone()
    for t in scheduler.timesteps:
        latent_model_input = latents.to(dtype)
        timestep = t.expand(latents.shape[0])
        noise_pred = model(latent_model_input, timestep, inputs["text"], False)
        noise_uncond = model(latent_model_input, timestep, inputs["negative"], True)
        noise_pred = noise_uncond + GUIDANCE * (noise_pred - noise_uncond)
        latents = scheduler.step(noise_pred, t, latents, return_dict=False)[0]
    return latents


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


def check_run(out: Path, folder: Path, bf16_io: bool, failures: list[str], what: str) -> None:
    import torch
    from diffusers import WanTransformer3DModel
    from safetensors.torch import load_file

    inputs = load_file(str(folder / "inputs.safetensors"))
    recorded = load_file(str(out))
    replay = Replay(recorded)
    replayed = diffusers_loop(replay, inputs, torch.bfloat16 if bf16_io else torch.float32)
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
    model = WanTransformer3DModel.from_pretrained(folder).eval()
    with torch.no_grad():
        theirs = diffusers_loop(lambda x, t, text, _: model(x, t, text, return_dict=False)[0], inputs, torch.float32)
    difference = (theirs - ours).abs().max().item() / theirs.abs().max().item()
    within = difference <= FP32_TOLERANCE
    print(f"{what}: against diffusers' own loop over WanTransformer3DModel: {difference:.2e} of the largest value: "
          f"{'within' if within else 'BEYOND'} {FP32_TOLERANCE:.0e}")
    if not within:
        failures.append(f"{what}: {difference:.2e} from diffusers' own loop")


def main() -> None:
    args = driver_arguments()
    with tempfile.TemporaryDirectory(prefix="loom-sampler-") as scratch:
        folder = Path(scratch) / "wan"
        make(folder)
        loom = LoomRuns(args)
        failures: list[str] = []
        for strategy in strategies(args.ranks):
            for bf16_io in (False, True):
                out = Path(scratch) / f"{strategy}{'-bf16' if bf16_io else ''}.safetensors"
                if loom(folder, strategy, str(out), *(["--bf16-io"] if bf16_io else [])):
                    check_run(out, folder, bf16_io, failures, f"{strategy}{' bf16 io' if bf16_io else ''}")
        failures += loom.failures
        if failures:
            sys.exit("FAILED: " + "; ".join(failures))
    print(f"loom's Euler sampler is diffusers' loop at {args.ranks} rank(s): bit for bit over the same model, within "
          "fp32 rounding over each side's own")


if __name__ == "__main__":
    main()

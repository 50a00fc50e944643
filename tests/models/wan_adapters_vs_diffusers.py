#!/usr/bin/env python3
"""loom's LoRA adapters for Wan, and the model with them merged, loaded by diffusers and PEFT.

A small random WanTransformer3DModel is saved with save_pretrained (no hub); wan-adapter (loom) builds
it with pretrained(...) and lora(4, {to_q, to_k, to_v, to_out.0}, {.alpha = 8}), trains a few steps
(under local() on one rank, under fsdp() with the adapters replicated on two), and saves the adapter
in diffusers' file and in PEFT's folder, the merged model with save_pretrained (whole, and in shards
with diffusers' index), and its velocity for fixed inputs. Here each is loaded the way a diffusers
user loads it:

- diffusers' file by WanTransformer3DModel.load_lora_adapter(folder, weight_name=..., prefix="transformer"), whose
  LoraConfig must be the one in the file's metadata (alpha 8, not the rank diffusers would guess);
- the same file by WanPipeline.load_lora_weights(folder), on a pipeline holding the transformer alone;
- PEFT's folder by PeftModel.from_pretrained(base, folder), and by AutoPeftModel.from_pretrained(folder),
  which loads the base model itself from the folder's base_model_name_or_path and auto_mapping;
- the merged folders by WanTransformer3DModel.from_pretrained(folder).

Each velocity must equal loom's within 1e-5 of its largest magnitude (fp32), with no warning from
diffusers or PEFT (an unused or missing key is one); and loom's adapted velocity must differ from the
base model's by at least 100 times that bound, so that an adapter that did nothing fails.

    wan_adapters_vs_diffusers.py --loom-run L --program P --ranks N
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

from loom_runs import driver_arguments

from wan_vs_diffusers import CONFIGS, random_wan

CONFIG = "heads3-patch122"
FP32_TOLERANCE = 1e-5
# How much further from the base model than the bound the adapted velocity must be.
ADAPTED_MARGIN = 100


class WarningsSeen(logging.Handler):
    """diffusers and PEFT warn through logging (a key the adapter has and the model lacks, say)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(f"{record.name}: {record.getMessage()}")


def make(folder: Path) -> None:
    import torch
    from safetensors.torch import save_file

    config, batch, grid, text_length = CONFIGS[CONFIG]
    random_wan(config, 300).save_pretrained(folder / "base")
    inputs = torch.Generator().manual_seed(11)
    save_file({"latents": torch.randn(batch, config["in_channels"], *grid, generator=inputs),
               "timestep": torch.rand(batch, generator=inputs) * 1000,
               "text": torch.randn(batch, text_length, config["text_dim"], generator=inputs)},
              str(folder / "base" / "inputs.safetensors"))


def compare(folder: Path, out: Path) -> list[str]:
    """What diffusers and PEFT compute with loom's files, against loom's velocity; the failures."""
    import torch
    from diffusers import WanPipeline, WanTransformer3DModel
    from peft import AutoPeftModel, PeftModel
    from safetensors.torch import load_file

    base_folder = folder / "base"
    inputs = load_file(str(base_folder / "inputs.safetensors"))
    loom = load_file(str(out / "outputs.safetensors"))

    def velocity(model) -> torch.Tensor:
        with torch.no_grad():
            return model(inputs["latents"], inputs["timestep"], inputs["text"], return_dict=False)[0]

    def base() -> WanTransformer3DModel:
        return WanTransformer3DModel.from_pretrained(base_folder).eval()

    def through_load_lora_adapter() -> torch.nn.Module:
        model = base()
        # Without weight_name (or use_safetensors=True) the model's loader looks for the pickled file.
        model.load_lora_adapter(str(out / "diffusers"), weight_name="pytorch_lora_weights.safetensors",
                                prefix="transformer", adapter_name="loom")
        config = model.peft_config["loom"]
        if (config.r, config.lora_alpha) != (4, 8):
            raise AssertionError(f"diffusers built r {config.r}, lora_alpha {config.lora_alpha}, not the file's 4 and 8")
        return model

    def through_pipeline() -> torch.nn.Module:
        pipeline = WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=None, transformer=base())
        pipeline.load_lora_weights(str(out / "diffusers"))
        return pipeline.transformer

    loads = {
        "diffusers' file, WanTransformer3DModel.load_lora_adapter": (through_load_lora_adapter, "adapted"),
        "diffusers' file, WanPipeline.load_lora_weights": (through_pipeline, "adapted"),
        "PEFT's folder, PeftModel.from_pretrained": (lambda: PeftModel.from_pretrained(base(), out / "peft"),
                                                     "adapted"),
        "PEFT's folder, AutoPeftModel.from_pretrained": (lambda: AutoPeftModel.from_pretrained(out / "peft"),
                                                         "adapted"),
        "merged, WanTransformer3DModel.from_pretrained": (
            lambda: WanTransformer3DModel.from_pretrained(out / "merged"), "merged"),
        "merged in shards, WanTransformer3DModel.from_pretrained": (
            lambda: WanTransformer3DModel.from_pretrained(out / "merged-sharded"), "merged"),
    }
    failures = []
    if not (out / "merged-sharded" / "diffusion_pytorch_model.safetensors.index.json").exists():
        failures.append("the sharded merged model has no diffusion_pytorch_model.safetensors.index.json")
    seen = WarningsSeen()
    for name in ("diffusers", "peft"):
        logging.getLogger(name).addHandler(seen)
    for what, (load, expected) in loads.items():
        seen.seen.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            model = load().eval()
        reference = loom[expected]
        difference = (velocity(model) - reference).abs().max().item()
        allowed = FP32_TOLERANCE * reference.abs().max().item()
        within = difference <= allowed and not seen.seen
        print(f"{what}: largest difference from loom's {expected} velocity {difference:.2e}: "
              f"{'within' if difference <= allowed else 'BEYOND'} {allowed:.2e}"
              + "".join(f"; warned: {line}" for line in seen.seen))
        if not within:
            failures.append(what)
    adapted = loom["adapted"]
    moved = (adapted - velocity(base())).abs().max().item()
    needed = ADAPTED_MARGIN * FP32_TOLERANCE * adapted.abs().max().item()
    print(f"loom's adapted velocity against the base model's: largest difference {moved:.2e} "
          f"({'at least' if moved >= needed else 'LESS THAN'} {needed:.2e})")
    if moved < needed:
        failures.append("the adapter barely changes the velocity")
    return failures


def main() -> None:
    args = driver_arguments()
    os.environ["HF_HUB_OFFLINE"] = "1"  # AutoPeftModel would ask the hub for a tokenizer
    with tempfile.TemporaryDirectory(prefix="loom-wan-adapters-") as scratch:
        folder = Path(scratch)
        make(folder)
        strategy = "local" if args.ranks == 1 else "fsdp"
        command = [args.loom_run, "--nproc-per-node", str(args.ranks), "--", args.program, str(folder / "base"),
                   str(folder / "out"), strategy]
        print("$", " ".join(command), flush=True)
        done = subprocess.run(command, timeout=120, capture_output=True, text=True)
        print(done.stdout, done.stderr, end="", flush=True)
        if done.returncode != 0:
            sys.exit(f"FAILED: wan-adapter under {strategy} at {args.ranks} rank(s)")
        failures = compare(folder, folder / "out")
        if failures:
            sys.exit("FAILED: " + "; ".join(failures))
    print(f"diffusers and PEFT load loom's Wan adapters and merged model, trained under {strategy} at "
          f"{args.ranks} rank(s), and give its velocity")


if __name__ == "__main__":
    main()

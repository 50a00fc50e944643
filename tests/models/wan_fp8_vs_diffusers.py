#!/usr/bin/env python3
"""A Wan whose frozen base loom holds in fp8 (quantized(loom::fp8): float8 e4m3, one scale per output
row, torchao's Float8WeightOnlyConfig) against diffusers' WanTransformer3DModel computing with the same
weights: a small random model saved by diffusers in bf16 (what diffusers keeps in fp32 in fp32, as
from_pretrained(torch_dtype=torch.bfloat16) holds it), built by loom as the benchmark's fp8 Wan is
(default_dtype(bf16) | pretrained | quantized(fp8) | lora | mixed_precision(bf16), wan_fp8_parity.cpp),
under fsdp() and ddp() at 2 ranks.

The driver dequantizes each weight itself, by torchao's formula (loom/quant/fp8.hpp): amax of each row
in the weight's dtype (bf16), scale = amax / 448 in that dtype, then fp32; codes = (w in fp32 / scale)
clamped to ±448, cast to float8_e4m3fn; dequantized = code in fp32 · scale. Which layers: every
nn.Linear of diffusers' model but those under time_embedder (diffusers' _keep_in_fp32_modules, which its
quantizers leave alone); loom must name the same ones.

What is close enough is measured on diffusers itself: its own bf16 error is the root mean square of
its velocity in bf16 (loaded with torch_dtype=torch.bfloat16, the dequantized weights in bf16, the
latents and text in bf16) from its velocity in fp32 on the fp32 dequantized weights; loom's velocity
must be within BF16_MARGIN times that of the fp32 one. loom must also be farther than the bound from
diffusers on the weights unquantized, so that a base left in bf16 would fail.

Measured (2 cores): diffusers' own bf16 error 7.6e-3 (velocity up to 3.8); loom's 8.5e-3 under fsdp
and 7.9e-3 under ddp; loom without quantized(fp8) is 5.8e-2 away (and names no layer), diffusers on the
unquantized weights 5.7e-2. loom is built with mixed_precision's cast_forward_inputs off: on, fsdp()
casts Wan's float timestep to bf16 and loom is 0.30 away (wan_fp8_parity.cpp).

    wan_fp8_vs_diffusers.py --loom-run L --program P --ranks N
"""
from __future__ import annotations

import math
import subprocess
import sys
import tempfile
from pathlib import Path

from loom_runs import driver_arguments

BF16_MARGIN = 2
CONFIG = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
              text_dim=24, freq_dim=32, ffn_dim=64, num_layers=2, cross_attn_norm=True, rope_max_seq_len=16)
UNQUANTIZED = ("time_embedder",)  # diffusers' _keep_in_fp32_modules that hold linear layers


def make(folder: Path) -> Path:
    import torch
    from diffusers import WanTransformer3DModel
    from safetensors.torch import save_file

    torch.manual_seed(200)
    model = WanTransformer3DModel(**CONFIG).eval()
    with torch.no_grad():
        for key, parameter in model.named_parameters():
            if "norm" in key and key.endswith("weight"):
                parameter.uniform_(0.5, 1.5)
            else:
                parameter.normal_(0.0, 0.2)
    model.save_pretrained(folder / "fp32")
    checkpoint = folder / "bf16"
    WanTransformer3DModel.from_pretrained(folder / "fp32", torch_dtype=torch.bfloat16).save_pretrained(checkpoint)
    inputs = torch.Generator().manual_seed(7)
    save_file({"latents": torch.randn(2, CONFIG["in_channels"], 3, 6, 8, generator=inputs),
               "timestep": torch.rand(2, generator=inputs) * 1000,
               "text": torch.randn(2, 7, CONFIG["text_dim"], generator=inputs)}, str(checkpoint / "inputs.safetensors"))
    return checkpoint


def fp8_dequantized(weight):
    """torchao's float8 weight-only, a scale per row, of `weight` (bf16), dequantized in fp32."""
    import torch

    amax = weight.abs().amax(dim=1, keepdim=True)  # in the weight's dtype
    scale = (amax / 448).float().clamp(min=torch.finfo(torch.float32).tiny)
    codes = (weight.float() / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    return codes.float() * scale


def quantized_layers(model) -> list[str]:
    import torch

    return sorted(name for name, module in model.named_modules()
                  if isinstance(module, torch.nn.Linear) and not any(f"{u}." in name + "." for u in UNQUANTIZED))


def velocity(checkpoint: Path, dtype, dequantize: bool):
    """diffusers' velocity for the inputs, its model loaded in `dtype` (what it keeps in fp32 in fp32) with
    the fp8 layers' weights dequantized, or as they are."""
    import torch
    from diffusers import WanTransformer3DModel
    from safetensors.torch import load_file

    model = WanTransformer3DModel.from_pretrained(checkpoint, torch_dtype=dtype).eval()
    stored = load_file(str(checkpoint / "diffusion_pytorch_model.safetensors"))
    modules = dict(model.named_modules())
    if dequantize:
        with torch.no_grad():
            for name in quantized_layers(model):
                weight = stored[f"{name}.weight"]
                assert weight.dtype == torch.bfloat16, f"{name} is {weight.dtype}"
                modules[name].weight.copy_(fp8_dequantized(weight))
    inputs = load_file(str(checkpoint / "inputs.safetensors"))
    with torch.no_grad():
        return model(inputs["latents"].to(dtype), inputs["timestep"], inputs["text"].to(dtype),
                     return_dict=False)[0].float(), quantized_layers(model)


def rms(a, b) -> float:
    return (a - b).square().mean().sqrt().item()


def main() -> int:
    args = driver_arguments()
    import torch
    from safetensors.torch import load_file

    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="loom-wan-fp8-") as scratch:
        root = Path(scratch)
        checkpoint = make(root)
        reference, layers = velocity(checkpoint, torch.float32, dequantize=True)
        own = rms(velocity(checkpoint, torch.bfloat16, dequantize=True)[0], reference)
        unquantized = velocity(checkpoint, torch.float32, dequantize=False)[0]
        allowed = BF16_MARGIN * own
        print(f"diffusers' own bf16 error {own:.3e} (largest value {reference.abs().max().item():.2e}); "
              f"unquantized it is {rms(unquantized, reference):.3e} away", flush=True)
        if not rms(unquantized, reference) > 2 * allowed:
            failures.append("fp8 moves diffusers' velocity too little to tell a quantized base from none")
        for strategy in ["local"] if args.ranks == 1 else ["fsdp", "ddp"]:
            out = root / f"loom-{strategy}"
            command = [args.loom_run, "--nproc-per-node", str(args.ranks), "--", args.program, str(checkpoint),
                       strategy, str(out)]
            print("$", " ".join(command), flush=True)
            done = subprocess.run(command, timeout=120, capture_output=True, text=True)
            print(done.stdout, done.stderr, end="", flush=True)
            if done.returncode != 0:
                failures.append(f"{strategy}: loom failed")
                continue
            named = sorted((out / "quantized.txt").read_text().split())
            if named != layers:
                failures.append(f"{strategy}: loom holds {named} in fp8, diffusers' quantizers would {layers}")
            ours = load_file(str(out / "output.safetensors"))["output"]
            difference = rms(ours, reference) if ours.shape == reference.shape else math.inf
            ok = difference <= allowed
            print(f"{strategy}: loom's fp8 Wan, rms difference from diffusers' fp32 on the dequantized weights "
                  f"{difference:.3e} ({len(named)} layers in fp8): {'within' if ok else 'BEYOND'} {allowed:.3e} "
                  f"({BF16_MARGIN} x diffusers' own in bf16); from the unquantized model {rms(ours, unquantized):.3e}",
                  flush=True)
            if not ok:
                failures.append(f"{strategy}: loom's velocity is beyond the bound")
    if failures:
        print("FAILED: " + "; ".join(failures))
        return 1
    print(f"loom's fp8 Wan gives diffusers' velocity on the dequantized weights within {BF16_MARGIN}x diffusers' "
          f"own bf16 error, at {args.ranks} rank(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

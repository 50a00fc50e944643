#!/usr/bin/env python3
"""Makes a small random Wan checkpoint with diffusers (no hub access), for wan-finetune to fine-tune:
config.json and diffusion_pytorch_model.safetensors, as WanTransformer3DModel.save_pretrained writes
them (a pipeline's transformer/ folder). With --experts RATIO, a Wan 2.2 A14B-shaped pipeline's folder
instead: model_index.json with that boundary_ratio, transformer/ and transformer_2/ (two random
experts of one shape, seeds SEED and SEED + 1) and scheduler/scheduler_config.json.

    make_wan.py OUT [--layers 2] [--heads 2] [--head-dim 16] [--text-dim 64] [--seed 0] [--experts 0.875]

Wan 2.1's own VAE channels (16) and patches (1, 2, 2); the text width is small so that the clips of
make_wan_latents.py stay small (give it the same --text-dim).
"""
from __future__ import annotations

import argparse
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=16)
    ap.add_argument("--text-dim", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--experts", type=float, metavar="RATIO",
                    help="write a pipeline of two experts split at this boundary_ratio")
    args = ap.parse_args()

    import json

    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, WanTransformer3DModel

    def random_wan(seed: int) -> WanTransformer3DModel:
        torch.manual_seed(seed)
        inner = args.heads * args.head_dim
        return WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=args.heads,
                                     attention_head_dim=args.head_dim, in_channels=16, out_channels=16,
                                     text_dim=args.text_dim, freq_dim=32, ffn_dim=2 * inner, num_layers=args.layers,
                                     cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6,
                                     rope_max_seq_len=1024)

    shape = f"{args.layers} blocks of {args.heads} heads of {args.head_dim}, text_dim {args.text_dim}"
    if args.experts is None:
        random_wan(args.seed).save_pretrained(args.out)
        print(f"{args.out}: a random Wan, {shape}")
        return
    random_wan(args.seed).save_pretrained(args.out / "transformer")
    random_wan(args.seed + 1).save_pretrained(args.out / "transformer_2")
    FlowMatchEulerDiscreteScheduler(shift=3.0).save_pretrained(args.out / "scheduler")
    index = {"_class_name": "WanPipeline", "boundary_ratio": args.experts, "expand_timesteps": False,
             "transformer": ["diffusers", "WanTransformer3DModel"],
             "transformer_2": ["diffusers", "WanTransformer3DModel"],
             "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"]}
    (args.out / "model_index.json").write_text(json.dumps(index, indent=2))
    print(f"{args.out}: a random Wan 2.2 A14B-shaped pipeline, two experts split at {args.experts}, {shape}")


if __name__ == "__main__":
    main()

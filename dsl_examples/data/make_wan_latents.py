#!/usr/bin/env python3
"""Writes a folder of clips for wan-finetune, one safetensors file each, with the names and shapes of
FastVideo's preprocessing: `vae_latent` [C, F, H, W] (the VAE's latents as the DiT takes them,
normalised by the VAE's latents_mean and latents_std) and `text_embedding` [L, D] (the text encoder's
states of the prompt's L tokens; wan-finetune pads them with zeros to --text-len, as FastVideo's
dataloader does).

    make_wan_latents.py OUT [--clips 12] [--channels 16] [--frames 3] [--height 8] [--width 8]
                            [--text-dim 4096] [--max-tokens 16] [--seed 0]

Random clips, made to be learnable: every clip's latents are one shared pattern plus a little noise
of its own, so flow matching has a mean to learn. Wan 2.1's VAE compresses 4 frames and 8×8 pixels
into a latent: 81 frames at 480×832 are --frames 21 --height 60 --width 104.
"""
from __future__ import annotations

import argparse
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--clips", type=int, default=12)
    ap.add_argument("--channels", type=int, default=16)
    ap.add_argument("--frames", type=int, default=3)
    ap.add_argument("--height", type=int, default=8)
    ap.add_argument("--width", type=int, default=8)
    ap.add_argument("--text-dim", type=int, default=4096, help="umT5-XXL's width (Wan's text encoder)")
    ap.add_argument("--max-tokens", type=int, default=16, help="the longest prompt, in tokens")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(args.seed)
    shape = (args.channels, args.frames, args.height, args.width)
    pattern = torch.randn(shape, generator=generator)
    args.out.mkdir(parents=True, exist_ok=True)
    for clip in range(args.clips):
        tokens = int(torch.randint(1, args.max_tokens + 1, (1,), generator=generator))
        latents = pattern + 0.3 * torch.randn(shape, generator=generator)
        text = torch.randn((tokens, args.text_dim), generator=generator)
        save_file({"vae_latent": latents.contiguous(), "text_embedding": text.contiguous()},
                  args.out / f"clip-{clip:05d}.safetensors")
    print(f"{args.out}: {args.clips} clips, latents {list(shape)}, text states up to {args.max_tokens} × {args.text_dim}")


if __name__ == "__main__":
    main()

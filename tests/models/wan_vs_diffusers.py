#!/usr/bin/env python3
"""loom::models::Wan against diffusers' WanTransformer3DModel, on checkpoints nobody here wrote: small
random models made with save_pretrained (no hub), in several configurations, and their velocity for
fixed latents, timesteps and text states. loom loads each checkpoint by name (pretrained(...), which
reads diffusers' diffusion_pytorch_model.safetensors and its sharded index; under fsdp() each rank
reads only the rows of its shards, about 1/N of the bytes, which the driver checks) and must give the
same velocity within 1e-5 of its largest magnitude (fp32), under local() on one rank and under ddp()
and fsdp() on 2, 3 and 4, and at 4 under hybrid sharding (fsdp({.shard_group_size = 2})). In bf16 (a base built in bf16 and frozen under LoRA, what diffusers keeps in
fp32 in fp32, as from_pretrained(torch_dtype=torch.bfloat16) holds it) the rms difference from
diffusers' fp32 velocity must be at most twice that of diffusers' own model in bf16.

    wan_vs_diffusers.py --loom-run L --program P --ranks N      (the driver)
    wan_vs_diffusers.py make FOLDER                              (the checkpoints alone)

The configurations: odd head counts and sizes, an odd freq_dim (its sinusoids padded), patches of one
frame over several frames, patches of two frames with frames, height and width that are not whole
patches (diffusers drops the remainder), with and without the cross-attention's norm, out_channels
of their own and null (in_channels), a checkpoint sharded over several files with an index, and Wan
2.2 TI2V-5B's 48 channels with a timestep a token (WanPipeline's expand_timesteps, the first frame's
tokens at 0).
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from loom_runs import LoomRuns, driver_arguments, strategies

# Each: the model's config, then the inputs' batch, [frames, height, width] and text length.
CONFIGS = {
    "heads3-patch122": (dict(patch_size=(1, 2, 2), num_attention_heads=3, attention_head_dim=10, in_channels=5,
                             out_channels=3, text_dim=24, freq_dim=17, ffn_dim=50, num_layers=2, cross_attn_norm=True,
                             rope_max_seq_len=16),
                        2, (3, 6, 10), 7),
    "heads5-patch222-no-cross-norm": (dict(patch_size=(2, 2, 2), num_attention_heads=5, attention_head_dim=8,
                                           in_channels=4, out_channels=None, text_dim=20, freq_dim=32, ffn_dim=36,
                                           num_layers=2, cross_attn_norm=False, rope_max_seq_len=8),
                                      2, (5, 7, 6), 5),
    "sharded": (dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=14, in_channels=4, out_channels=4,
                     text_dim=16, freq_dim=16, ffn_dim=40, num_layers=3, cross_attn_norm=True, rope_max_seq_len=32),
                1, (2, 4, 4), 9),
    # Wan 2.2 TI2V-5B's shape: 48 latent channels, and a timestep a token (expand_timesteps).
    "ti2v-expand-timesteps": (dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=48,
                                   out_channels=48, text_dim=16, freq_dim=16, ffn_dim=32, num_layers=2,
                                   cross_attn_norm=True, rope_max_seq_len=16),
                              2, (3, 4, 6), 5),
}


def per_token_timesteps(latents, timestep, patch_size):
    """WanPipeline's expand_timesteps (diffusers/pipelines/wan/pipeline_wan.py): one timestep a patch,
    [batch, F/p_t · H/p_h · W/p_w], made as the image-to-video case makes them, the first frame's
    tokens at 0 (it is given) and the others at the sample's timestep."""
    import torch

    mask = torch.ones(latents.shape, dtype=torch.float32)
    mask[:, :, 0] = 0
    _, p_h, p_w = patch_size
    return torch.stack([(mask[b][0][:, ::p_h, ::p_w] * timestep[b]).flatten() for b in range(latents.shape[0])])
FP32_TOLERANCE = 1e-5


def random_wan(config: dict, seed: int):
    """A WanTransformer3DModel of `config` whose weights are drawn from `seed`, larger than the default
    init, so that every block moves the velocity."""
    import torch
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    model = WanTransformer3DModel(**config).eval()
    with torch.no_grad():
        for key, parameter in model.named_parameters():
            if "norm" in key and key.endswith("weight"):
                parameter.uniform_(0.5, 1.5)
            else:
                parameter.normal_(0.0, 0.2)
    return model


def make(folder: Path) -> None:
    import torch
    from diffusers import WanTransformer3DModel
    from safetensors.torch import save_file

    for index, (name, (config, batch, grid, text_length)) in enumerate(CONFIGS.items()):
        model = random_wan(config, 200 + index)
        out = folder / name
        model.save_pretrained(out, max_shard_size="20KB" if name == "sharded" else "5GB")
        inputs = torch.Generator().manual_seed(7 + index)
        latents = torch.randn(batch, config["in_channels"], *grid, generator=inputs)
        timestep = torch.rand(batch, generator=inputs) * 1000
        if "expand-timesteps" in name:
            timestep = per_token_timesteps(latents, timestep, config["patch_size"])
        text = torch.randn(batch, text_length, config["text_dim"], generator=inputs)
        # In bf16 as the pipeline runs it: loaded with torch_dtype (what diffusers keeps in fp32 stays
        # fp32), the latents and text states in bf16, the timestep as it is.
        narrow = WanTransformer3DModel.from_pretrained(out, torch_dtype=torch.bfloat16).eval()
        with torch.no_grad():
            output = model(latents, timestep, text, return_dict=False)[0]
            output_bf16 = narrow(latents.bfloat16(), timestep, text.bfloat16(), return_dict=False)[0].float()
        save_file({"latents": latents, "timestep": timestep, "text": text, "output": output.contiguous(),
                   "output_bf16": output_bf16.contiguous()}, str(out / "expected.safetensors"))
    if not (folder / "sharded" / "diffusion_pytorch_model.safetensors.index.json").exists():
        sys.exit("FAILED: the sharded checkpoint has no index")


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        make(Path(sys.argv[2]))
        return
    args = driver_arguments()
    with tempfile.TemporaryDirectory(prefix="loom-wan-") as scratch:
        folder = Path(scratch)
        make(folder)
        loom = LoomRuns(args)
        for name in CONFIGS:
            for strategy in strategies(args.ranks, hybrid=True):
                loom(folder / name, strategy)
                loom(folder / name, strategy, "--bf16")
        failures = loom.failures
        if failures:
            sys.exit("FAILED: " + "; ".join(failures))
    print(f"loom's Wan gives diffusers' velocity for {len(CONFIGS)} checkpoints at {args.ranks} rank(s), in fp32 and "
          "bf16")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""loom::models::Llama against transformers' LlamaForCausalLM, on checkpoints nobody here wrote:
small random models made with save_pretrained (no hub), in several configurations, and their logits
for fixed token ids. loom loads each checkpoint by name (job.load_weights) and must give the same
logits within 1e-5 of their largest magnitude (fp32), under local() on one rank and under ddp() and
fsdp() on 2 and 3.

    llama_vs_transformers.py --loom-run L --program P --ranks N      (the driver)
    llama_vs_transformers.py make FOLDER                              (the checkpoints alone)

The configurations: grouped-query attention with an untied head; multi-head attention with a tied
head; llama3 rope scaling with attention and MLP biases and a head_dim of its own; and a checkpoint
sharded over several files with an index.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CONFIGS = {
    "gqa-untied": dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False),
    "mha-tied": dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True),
    "llama3-bias": dict(num_attention_heads=4, num_key_value_heads=1, head_dim=12, attention_bias=True, mlp_bias=True,
                        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
    "sharded": dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False),
}


def make(folder: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    for index, (name, extra) in enumerate(CONFIGS.items()):
        torch.manual_seed(100 + index)
        config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=56, num_hidden_layers=3,
                             max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=500.0, **extra)
        model = LlamaForCausalLM(config).eval()
        with torch.no_grad():  # larger than the default init, so that every layer moves the logits
            for parameter in model.parameters():
                parameter.normal_(0.0, 0.2)
            for module in model.modules():
                if type(module).__name__ == "LlamaRMSNorm":
                    module.weight.uniform_(0.5, 1.5)
        out = folder / name
        model.save_pretrained(out, max_shard_size="20KB" if name == "sharded" else "5GB")
        ids = torch.randint(0, config.vocab_size, (3, 24), generator=torch.Generator().manual_seed(7))
        with torch.no_grad():
            logits = model(ids).logits
        save_file({"ids": ids, "logits": logits.contiguous()}, str(out / "expected.safetensors"))
    if not (folder / "sharded" / "model.safetensors.index.json").exists():
        sys.exit("FAILED: the sharded checkpoint has no index")


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        make(Path(sys.argv[2]))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom-run", required=True)
    ap.add_argument("--program", required=True)
    ap.add_argument("--ranks", type=int, required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="loom-llama-") as scratch:
        folder = Path(scratch)
        make(folder)
        strategies = ["local"] if args.ranks == 1 else ["ddp", "fsdp"]
        for name in CONFIGS:
            for strategy in strategies:
                command = [args.loom_run, "--nproc-per-node", str(args.ranks), "--", args.program,
                           str(folder / name), strategy]
                print("$", " ".join(command), flush=True)
                if subprocess.run(command, timeout=120).returncode != 0:
                    sys.exit(f"FAILED: {name} under {strategy}")
    print(f"loom's Llama gives transformers' logits for {len(CONFIGS)} checkpoints at {args.ranks} rank(s)")


if __name__ == "__main__":
    main()

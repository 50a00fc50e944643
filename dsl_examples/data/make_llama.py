#!/usr/bin/env python3
"""Makes a small random Llama checkpoint with transformers (no hub access), for llama-finetune to
fine-tune: config.json and model.safetensors, as LlamaForCausalLM.save_pretrained writes them.

    make_llama.py OUT [--layers 4] [--hidden 128] [--seed 0]

Its vocabulary is 256 ids, so byte-level token files (make_tokens.py) fit it.
"""
from __future__ import annotations

import argparse
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(args.seed)
    config = LlamaConfig(vocab_size=256, hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3,
                         num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(args.out)
    print(f"{args.out}: a random Llama, {args.layers} layers of width {args.hidden}, vocab 256")


if __name__ == "__main__":
    main()

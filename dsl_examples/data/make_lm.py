#!/usr/bin/env python3
"""Makes a small random causal language model checkpoint with transformers (no hub access), for
lm-finetune to fine-tune: config.json and model.safetensors, as <Family>ForCausalLM.save_pretrained
writes them, of any family loom::models::CausalLM reads.

    make_lm.py OUT [--family llama|mistral|qwen2|qwen3|gemma3] [--layers 4] [--hidden 128] [--vocab 256] [--seed 0]

Its vocabulary is 256 ids unless --vocab says otherwise, so byte-level token files (make_tokens.py)
fit it; make_text_data.py's tokenizer wants its --vocab. Each family's model has
what sets it apart in its config: Mistral's and Qwen2's sliding window (on Qwen2's upper layers),
Qwen3's q and k norms with a head_dim of its own, Gemma 3's local and global layers.
"""
from __future__ import annotations

import argparse
from pathlib import Path

# transformers' config class, and each family's settings beyond the shared sizes.
FAMILIES = {
    "llama": ("LlamaConfig", dict(tie_word_embeddings=False)),
    "mistral": ("MistralConfig", dict(sliding_window=64)),
    "qwen2": ("Qwen2Config", dict(use_sliding_window=True, sliding_window=64, max_window_layers=2,
                                  tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", dict(head_dim=48, tie_word_embeddings=True)),
    "gemma3": ("Gemma3TextConfig", dict(head_dim=32, sliding_window=64, sliding_window_pattern=2,
                                        query_pre_attn_scalar=32)),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--family", choices=sorted(FAMILIES), default="llama")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    torch.manual_seed(args.seed)
    config_class, extra = FAMILIES[args.family]
    config = getattr(transformers, config_class)(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3,
        num_hidden_layers=args.layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5, **extra)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(args.out)
    print(f"{args.out}: a random {type(model).__name__}, {args.layers} layers of width {args.hidden}, vocab {args.vocab}")


if __name__ == "__main__":
    main()

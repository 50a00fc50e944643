#!/usr/bin/env python3
"""Makes a small random causal language model checkpoint with transformers (no hub access), for
lm-finetune to fine-tune: config.json and model.safetensors, as <Family>ForCausalLM.save_pretrained
writes them, of any family loom::models::CausalLM reads.

    make_lm.py OUT [--family llama|mistral|qwen2|qwen3|gemma3] [--layers 4] [--hidden 128] [--vocab 256] [--seed 0]

Its vocabulary is 256 ids unless --vocab says otherwise, so byte-level token files (make_tokens.py)
fit it; make_text_data.py's tokenizer wants its --vocab. Beside the weights it writes a byte-level
tokenizer (tokenizer.json, tokenizer_config.json) whose ids are the bytes, as make_tokens.py's are,
so `lm-finetune --data` and `--sample` read text with the checkpoint's own tokenizer: GPT-2's
byte-to-character map, no merges, and the NUL byte (id 0), which text does not hold, as the
end-of-text token that joins documents; ids from 256 up, with a larger --vocab, go unused. Each family's model has
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


END_OF_TEXT = 0  # the NUL byte's id


def byte_characters() -> list[str]:
    """GPT-2's map from each byte to the printable character that stands for it in a byte-level vocabulary."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + \
        list(range(ord("\u00ae"), ord("\u00ff") + 1))
    characters, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            characters[byte] = chr(byte)
        else:
            characters[byte] = chr(256 + extra)
            extra += 1
    return [characters[byte] for byte in range(256)]


def write_byte_tokenizer(out: Path) -> None:
    """A byte-level tokenizer whose id for each byte is the byte."""
    import json
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    characters = byte_characters()
    tokenizer = Tokenizer(models.BPE(vocab={c: byte for byte, c in enumerate(characters)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": characters[END_OF_TEXT],
        "pad_token": characters[END_OF_TEXT], "bos_token": None}, indent=2) + "\n")


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
    config.eos_token_id = config.pad_token_id = END_OF_TEXT
    config.bos_token_id = None
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(args.out)
    write_byte_tokenizer(args.out)
    print(f"{args.out}: a random {type(model).__name__}, {args.layers} layers of width {args.hidden}, vocab {args.vocab}")


if __name__ == "__main__":
    main()

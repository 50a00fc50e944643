#!/usr/bin/env python3
"""Makes a small random causal language model checkpoint with transformers (no hub access), for
lm-finetune to fine-tune: config.json and model.safetensors, as <Family>ForCausalLM.save_pretrained
writes them, of any family loom::models::CausalLM reads.

    make_lm.py OUT [--family llama|mistral|qwen2|qwen3|gemma3] [--layers 4] [--hidden 128] [--vocab 256] [--seed 0]

Its vocabulary is 256 ids unless --vocab says otherwise (256 at least), so byte-level token files
(make_tokens.py) fit it; make_text_data.py's tokenizer wants its --vocab. Beside the weights it
writes a byte-level tokenizer (tokenizer.json, tokenizer_config.json), bytes and no trained merges
whatever --vocab is, so `lm-finetune --data` and `--sample` read text with the checkpoint's own
tokenizer: GPT-2's byte-to-character map, each UTF-8 byte of the text its own id (make_tokens.py's
ids), and id 255 the end-of-text token <|endoftext|> that joins documents. UTF-8 never uses the byte
0xFF; byte 0's character Ā as end-of-text would end a document at every Ā in transformers, which
matches the end-of-text token in the text. Ids from 256 up, with a larger --vocab, go unused.

Each family's model has what sets it apart in its config: Mistral's and Qwen2's sliding window (on
Qwen2's upper layers), Qwen3's q and k norms with a head_dim of its own, Gemma 3's local and global
layers.
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


BYTES = 256
END_OF_TEXT = 255  # the byte 0xFF's id: UTF-8 text never holds it


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
    """A byte-level tokenizer whose id for each byte of UTF-8 text is the byte."""
    import json
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    end_of_text = "<|endoftext|>"
    vocab = {c: byte for byte, c in enumerate(byte_characters())}
    vocab = {(end_of_text if byte == END_OF_TEXT else c): byte for c, byte in vocab.items()}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(end_of_text, special=True)])
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": end_of_text, "pad_token": end_of_text,
        "bos_token": None}, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--family", choices=sorted(FAMILIES), default="llama")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.vocab < BYTES:
        ap.error(f"--vocab {args.vocab} is too small for the byte-level tokenizer written beside the model: "
                 f"give --vocab {BYTES} or more")

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

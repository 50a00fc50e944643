#!/usr/bin/env python3
"""Writes a token file for lm-finetune in llm.c's format: 256 little-endian int32 (magic, version,
token count, zeros), then the tokens, uint16 (magic 20240520, version 1) when every id fits, else
uint32 (magic 20240801, version 7).

    make_tokens.py TEXT OUT.bin                       byte-level ids: each byte of TEXT is its id (0..255)
    make_tokens.py TEXT OUT.bin --tokenizer DIR       a Hugging Face tokenizer folder (local files only)

Byte-level ids need a model whose vocab_size is at least 256 (make_lm.py's is).
"""
from __future__ import annotations

import argparse
import struct
import sys
from pathlib import Path

GPT2_MAGIC, GPT2_VERSION = 20240520, 1
LLAMA3_MAGIC, LLAMA3_VERSION = 20240801, 7
HEADER_INTS = 256


def write_tokens(out: Path, ids: list[int]) -> None:
    if not ids:
        sys.exit(f"make_tokens: no tokens to write to {out}")
    wide = max(ids) >= 1 << 16
    magic, version = (LLAMA3_MAGIC, LLAMA3_VERSION) if wide else (GPT2_MAGIC, GPT2_VERSION)
    header = [magic, version, len(ids)] + [0] * (HEADER_INTS - 3)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("wb") as f:
        f.write(struct.pack(f"<{HEADER_INTS}i", *header))
        f.write(struct.pack(f"<{len(ids)}{'I' if wide else 'H'}", *ids))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("text", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--tokenizer", type=Path, help="a Hugging Face tokenizer folder (tokenizer.json and its config)")
    args = ap.parse_args()
    if args.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer, local_files_only=True)
        ids = tokenizer(args.text.read_text(encoding="utf-8"))["input_ids"]
    else:
        ids = list(args.text.read_bytes())
    write_tokens(args.out, ids)
    print(f"{args.out}: {len(ids)} tokens, ids up to {max(ids)}")


if __name__ == "__main__":
    main()

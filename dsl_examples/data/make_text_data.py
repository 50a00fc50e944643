#!/usr/bin/env python3
"""Makes text data for lm-finetune's --data: the licence texts of /usr/share/common-licenses as JSON
Lines (a document per paragraph, every tenth held out), and a byte-level BPE tokenizer trained on
them with the tokenizers library, locally (GPT-2's layout, <|endoftext|> its end of text):

    OUT/train.jsonl, OUT/eval.jsonl     {"text": ..., "source": "GPL-3"} a line
    OUT/tokenizer/                      tokenizer.json and tokenizer_config.json
    OUT/train.bin                       train.jsonl tokenized, each document ended by <|endoftext|>:
                                        an llm.c token file, the same data pre-tokenized

    make_text_data.py OUT [--vocab 512] [--licences /usr/share/common-licenses]

A model for it needs a vocab_size of at least --vocab (make_lm.py --vocab).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tokens import write_tokens  # noqa: E402

END_OF_TEXT = "<|endoftext|>"


def paragraphs(licences: Path) -> list[tuple[str, str]]:
    """(licence, paragraph) for every non-empty paragraph of every licence file, in name order."""
    found = []
    for path in sorted(p for p in licences.iterdir() if p.is_file()):
        text = path.read_text(encoding="utf-8", errors="replace")
        found += [(path.name, block.strip()) for block in text.split("\n\n") if block.strip()]
    return found


def byte_level_bpe(texts, vocab: int, special_tokens: list[str]):
    """A byte-level BPE (GPT-2's layout) of `vocab` ids, `special_tokens` among them, trained on `texts`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=special_tokens,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--licences", type=Path, default=Path("/usr/share/common-licenses"))
    args = ap.parse_args()

    documents = paragraphs(args.licences)
    if not documents:
        sys.exit(f"make_text_data: no text in {args.licences}")
    args.out.mkdir(parents=True, exist_ok=True)
    train = [d for i, d in enumerate(documents) if i % 10 != 9]
    held_out = [d for i, d in enumerate(documents) if i % 10 == 9]
    for name, part in (("train.jsonl", train), ("eval.jsonl", held_out)):
        with (args.out / name).open("w", encoding="utf-8") as f:
            for source, text in part:
                f.write(json.dumps({"text": text, "source": source}, ensure_ascii=False) + "\n")

    tokenizer = byte_level_bpe((text for _, text in train), args.vocab, [END_OF_TEXT])
    folder = args.out / "tokenizer"
    folder.mkdir(exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": END_OF_TEXT, "bos_token": None}, indent=2) + "\n")

    end = tokenizer.token_to_id(END_OF_TEXT)
    ids = [i for encoding in tokenizer.encode_batch([text for _, text in train]) for i in encoding.ids + [end]]
    write_tokens(args.out / "train.bin", ids)
    print(f"{args.out}: {len(train)} documents to train on, {len(held_out)} held out, {len(ids)} tokens; "
          f"a byte-level BPE of {tokenizer.get_vocab_size()} ids in {folder}")


if __name__ == "__main__":
    main()

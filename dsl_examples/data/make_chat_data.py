#!/usr/bin/env python3
"""Makes instruction-tuning data for lm-finetune --chat: conversations about the licence texts of
/usr/share/common-licenses, in OpenAI's messages shape, and a tokenizer with a ChatML chat template,
trained with the tokenizers library, locally:

    OUT/train.jsonl, OUT/eval.jsonl     {"messages": [system, user, assistant, ...]} a line (every tenth held out)
    OUT/tokenizer/                      tokenizer.json, and tokenizer_config.json with the chat template

Each conversation gives a paragraph of a licence and asks which licence it comes from; the assistant
names it. Every third one goes on: the user asks how the paragraph begins and the assistant quotes its
first words. The paragraphs' lengths make a mix, from a line to a page. The template is ChatML's (as
Qwen's), with {% generation %} blocks around the assistant's replies, so that the loss goes on those
replies and their end-of-turn token.

    make_chat_data.py OUT [--vocab 512] [--licences /usr/share/common-licenses]

A model for it needs a vocab_size of at least --vocab (make_lm.py --vocab).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_text_data import byte_level_bpe, paragraphs  # noqa: E402

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}{% generation %}{{- message.content + '<|im_end|>' }}{% endgeneration %}"
    "{{- '\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
SYSTEM = "You say which licence a passage comes from."


def conversation(index: int, licence: str, paragraph: str) -> dict:
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": paragraph},
                {"role": "assistant", "content": f"It is from {licence}."}]
    if index % 3 == 0:
        messages += [{"role": "user", "content": "How does it begin?"},
                     {"role": "assistant", "content": " ".join(paragraph.split()[:6])}]
    return {"messages": messages}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--licences", type=Path, default=Path("/usr/share/common-licenses"))
    args = ap.parse_args()

    documents = paragraphs(args.licences)
    if not documents:
        sys.exit(f"make_chat_data: no text in {args.licences}")
    args.out.mkdir(parents=True, exist_ok=True)
    records = [conversation(i, licence, text) for i, (licence, text) in enumerate(documents)]
    for name, keep in (("train.jsonl", lambda i: i % 10 != 9), ("eval.jsonl", lambda i: i % 10 == 9)):
        with (args.out / name).open("w", encoding="utf-8") as f:
            for i, record in enumerate(records):
                if keep(i):
                    f.write(json.dumps(record, ensure_ascii=False) + "\n")

    words = [message["content"] for record in records for message in record["messages"]]
    tokenizer = byte_level_bpe(words + ["system", "user", "assistant"], args.vocab, SPECIAL)
    folder = args.out / "tokenizer"
    folder.mkdir(exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
         "pad_token": "<|endoftext|>", "chat_template": CHAT_TEMPLATE}, indent=2) + "\n")
    print(f"{args.out}: {len(records) - len(records) // 10} conversations to train on, {len(records) // 10} held out; "
          f"a byte-level BPE of {tokenizer.get_vocab_size()} ids with a ChatML chat template in {folder}")


if __name__ == "__main__":
    main()

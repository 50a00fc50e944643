#!/usr/bin/env python3
"""lm-finetune --chat, the recipe, end to end on a small random Qwen2 (sliding-window layers) with
make_chat_data.py's conversations and ChatML template, from dsl_examples/configs/lm_chat.yaml
(FastVideo's layout with a chat object), LoRA under fsdp() on 2 ranks:

- the data summary counts rank 0's epoch as the recipe reads it (examples, tokens, the share that
  carries loss, packing efficiency), and the loss share moves with chat.loss_on;
- every step's loss is finite and the held-out loss falls; --sample answers in the template;
- a run preempted (SIGTERM to loom-run) and started again ends with the adapter an uninterrupted run
  writes, byte for byte: the chat data's position is in the checkpoint;
- chat.packing=false trains each example in a row of its own, padded to the longest of its micro-batch;
- a malformed record is refused naming its file and line, or skipped and counted with --skip-malformed;
  a run file's chat object without --chat is refused in a sentence.

    lm_chat_check.py LOOM_RUN LM_FINETUNE SOURCE_DIR
"""
from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from preempted_run import preempted_and_resumed

SHORT = ["--train.steps=6", "--train.log_every=1", "--train.eval_every=3", "--train.checkpoint_every=100",
         "--seq-len", "256", "--batch-size", "2"]
SUMMARY = re.compile(r"data: (\d+) chat records in --data, --eval-data held out, rendered with the chat template of "
                     r"'[^']+'; rank 0's epoch: (\d+) examples, (\d+) tokens, ([\d.]+)% of them carrying loss")


def main() -> int:
    loom_run, recipe, source = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    data_scripts = source / "dsl_examples" / "data"
    config = source / "dsl_examples" / "configs" / "lm_chat.yaml"
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="loom-lm-chat-") as scratch:
        root = Path(scratch)
        chat, model = root / "chat", root / "model"
        subprocess.run([sys.executable, data_scripts / "make_chat_data.py", chat], check=True)
        subprocess.run([sys.executable, data_scripts / "make_lm.py", model, "--family", "qwen2", "--layers", "2",
                        "--hidden", "64", "--vocab", "512"], check=True, capture_output=True)

        def command(out: Path, *extra: str, data: Path = chat / "train.jsonl", run_file: Path = config,
                    chat_flag: bool = True) -> list[str]:
            return [loom_run, "--nproc-per-node", "2", "--", recipe, "--config", str(run_file), "--data", str(data),
                    "--eval-data", str(chat / "eval.jsonl"), "--tokenizer", str(chat / "tokenizer"), "--pretrained",
                    str(model), *(["--chat"] if chat_flag else []), *SHORT, f"--train.out={out}", *extra]

        straight = root / "straight"
        done = subprocess.run(command(straight, "--sample", "MIT License"), capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stdout[-3000:], done.stderr[-3000:])
            return 1
        summary = SUMMARY.search(done.stdout)
        if not summary or "packing efficiency" not in done.stdout:
            failures.append(f"no chat data summary: {done.stdout[:2000]}")
        else:
            records, examples, tokens, share = (float(v) for v in summary.groups())
            # Rank 0 reads every other record; those whose reply lies past --seq-len are left out.
            left_out = re.search(r"(\d+) records? left out \(no reply within --seq-len\)", done.stdout)
            kept = examples + (int(left_out.group(1)) if left_out else 0)
            if kept != math.ceil(records / 2) or not (2 <= share <= 30) or tokens < examples:
                failures.append(f"the summary's counts are not rank 0's epoch: {summary.group(0)}")
        metrics = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
        losses = [m["loss"] for m in metrics if "loss" in m]
        evals = [m["eval_loss"] for m in metrics if "eval_loss" in m]
        if len(losses) != 6 or not all(math.isfinite(v) for v in losses):
            failures.append(f"the steps' losses are not 6 finite numbers: {losses}")
        if len(evals) != 2 or not evals[1] < evals[0]:
            failures.append(f"the held-out loss did not fall: {evals}")
        if not re.search(r"sample from \"MIT License\":\n\[rank 0\]   ", done.stdout):
            failures.append(f"--sample gave no answer: {done.stdout[-800:]}")

        every = subprocess.run(command(root / "every", "--chat.loss_on=every_token", "--train.steps=1",
                                       "--train.eval_every=1"), capture_output=True, text=True)
        every_share = SUMMARY.search(every.stdout)
        if every.returncode != 0 or not every_share or float(every_share.group(4)) < 95:
            failures.append(f"chat.loss_on=every_token did not put the loss on every token: "
                            f"{every.stdout[:1500]}{every.stderr[-800:]}")

        preempted = root / "preempted"
        failures += preempted_and_resumed(command(preempted), r"lm-finetune step +2/6", preempted, straight)

        padded = subprocess.run(command(root / "padded", "--chat.packing=false", "--train.steps=2"),
                                capture_output=True, text=True)
        if padded.returncode != 0 or "one example a row, each micro-batch padded to its longest" not in padded.stdout:
            failures.append(f"chat.packing=false did not train unpacked: {padded.stdout[-1500:]}{padded.stderr[-800:]}")

        bad = root / "bad.jsonl"
        lines = (chat / "train.jsonl").read_text().splitlines()[:40]
        lines[:10] = ['{"messages": "not a list"}'] * 10  # some of them on each rank
        bad.write_text("\n".join(lines) + "\n")
        refused = subprocess.run(command(root / "bad", data=bad), capture_output=True, text=True)
        if refused.returncode == 0 or not re.search(re.escape(str(bad)) + r":([1-9]|10): ", refused.stderr):
            failures.append(f"a malformed record was not refused by file and line: {refused.stderr[-800:]}")
        skipped = subprocess.run(command(root / "skipped", "--skip-malformed", "--train.steps=1", data=bad),
                                 capture_output=True, text=True)
        if skipped.returncode != 0 or not re.search(r", [1-9]\d* malformed records? skipped", skipped.stdout):
            failures.append(f"--skip-malformed did not skip and count: {skipped.stdout[-800:]}{skipped.stderr[-800:]}")

        without = subprocess.run(command(root / "without", chat_flag=False), capture_output=True, text=True)
        if without.returncode == 0 or "has a \"chat\" object, which says how --chat reads chat records: add --chat" \
                not in without.stderr:
            failures.append(f"a chat object without --chat was not refused: {without.stderr[-800:]}")
    for failure in failures:
        print("FAIL:", failure)
    print("lm-finetune --chat:", "ok" if not failures else f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

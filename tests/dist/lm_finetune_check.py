#!/usr/bin/env python3
"""lm-finetune, the recipe, end to end on a small random Qwen3 (q and k norms, a
head_dim of its own, a tied head) that transformers makes here: from a
YAML run file in FastVideo's layout, LoRA under fsdp() on 2 ranks, on an llm.c token file.

- the same run under tensor_parallel(2) (tp_size) at 4 ranks gives the same losses and adapter;
- a run preempted (SIGTERM to loom-run) and started again ends with the adapter an uninterrupted run
  writes, byte for byte; metrics.jsonl lists the steps it logged;
- PEFT loads the adapter onto the checkpoint (warnings as errors), transformers loads the merged
  weights, and the two give the same logits, which differ from the checkpoint's own;
- with the LoRA block's enable: false the run says so once, and a token file the model's vocabulary
  cannot read is refused naming the token.

    lm_finetune_check.py LOOM_RUN LM_FINETUNE SOURCE_DIR
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

from preempted_run import preempted_and_resumed

RUN_FILE = """\
# FastVideo's layout: the LoRA block of the model's role, the strategy under training.distributed.
plan:
  - seeded: 3
  - pretrained: {model}
models:
  transformer:
    lora:
      enable: {enable}
      rank: 4
      alpha: 8
      target_modules: [q_proj, v_proj, down_proj]
training:
  distributed:
    strategy: FSDP
  steps: 8
  checkpoint_every: 100
  eval_every: 4
  log_every: 1
  lr: {{peak: 1e-2, warmup_steps: 2, decay_steps: 6, decay: cosine}}
"""


def main() -> int:
    loom_run, recipe, source = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    data = source / "dsl_examples" / "data"
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="loom-lm-finetune-") as scratch:
        root = Path(scratch)
        model, tokens = root / "model", root / "tokens.bin"
        subprocess.run([sys.executable, data / "make_lm.py", model, "--family", "qwen3", "--layers", "2", "--hidden", "64"], check=True)
        subprocess.run([sys.executable, data / "make_tokens.py", "/usr/share/common-licenses/GPL-3", tokens], check=True)
        config = root / "run.yaml"
        config.write_text(RUN_FILE.format(model=model, enable="true"))

        def command(out: Path, *extra: str) -> list[str]:
            return [loom_run, "--nproc-per-node", "2", "--", recipe, "--config", str(config), "--tokens", str(tokens),
                    "--batch-size", "2", "--seq-len", "32", f"--train.out={out}", *extra]

        straight = root / "straight"
        done = subprocess.run(command(straight, "--merged"), capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stdout[-3000:], done.stderr[-3000:])
            return 1
        logged = [json.loads(line)["step"] for line in (straight / "metrics.jsonl").read_text().splitlines()
                  if "loss" in json.loads(line)]
        if logged != list(range(1, 9)):
            failures.append(f"metrics.jsonl logged the steps {logged}, not 1..8")
        if "lora(rank=4, alpha=8" not in done.stdout or "fsdp(" not in done.stdout:
            failures.append(f"the plan from the YAML file is not the one described:\n{done.stdout[:1500]}")

        # tensor_parallel(2) at 4 ranks (FastVideo's tp_size), the same 2 data-parallel ranks reading the
        # same batches: every step's loss within fp32 rounding of the unsplit run's, and its adapter saved
        # whole, the unsplit run's within AdamW's amplified rounding.
        split = root / "split"
        four_ranks = [loom_run, "--nproc-per-node", "4", *command(split, "--training.distributed.tp_size=2")[3:]]
        split_run = subprocess.run(four_ranks, capture_output=True, text=True)
        if split_run.returncode != 0 or "tensor_parallel(size=2)" not in split_run.stdout:
            failures.append(f"the tp_size 2 run failed: {split_run.stdout[-1500:]}{split_run.stderr[-1500:]}")
        else:
            def losses(folder: Path) -> list[float]:
                return [json.loads(line)["loss"] for line in (folder / "metrics.jsonl").read_text().splitlines()
                        if "loss" in json.loads(line)]
            pairs = list(zip(losses(split), losses(straight)))
            if len(pairs) != 8 or any(abs(a - b) > 1e-5 * abs(b) for a, b in pairs):
                failures.append(f"tp_size 2's losses are not the unsplit run's: {pairs}")
            from safetensors.torch import load_file
            mine, theirs = (load_file(folder / "adapter" / "adapter_model.safetensors") for folder in (split, straight))
            if mine.keys() != theirs.keys() or any(mine[k].shape != theirs[k].shape for k in mine):
                failures.append("tp_size 2's adapter is not the unsplit run's tensors, whole")
            elif any((mine[k] - theirs[k]).abs().max() > 1e-3 * theirs[k].abs().max() for k in mine):
                failures.append("tp_size 2's adapter's values are not the unsplit run's")

        preempted = root / "preempted"
        failures += preempted_and_resumed(command(preempted), r"lm-finetune step +3/8", preempted, straight)

        import torch
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(5))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            # PEFT 0.21 reads an attribute transformers 5 has deprecated: theirs, not about the files.
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing. is deprecated", category=FutureWarning)
            base = AutoModelForCausalLM.from_pretrained(model).eval()
            with torch.no_grad():
                before = base(ids).logits
            adapted = PeftModel.from_pretrained(base, straight / "adapter").eval()
            merged = AutoModelForCausalLM.from_pretrained(straight / "merged").eval()
            # The adapter names its task and its base model: PEFT loads both from the folder alone.
            from peft import AutoPeftModelForCausalLM
            on_its_own = AutoPeftModelForCausalLM.from_pretrained(straight / "adapter").eval()
        with torch.no_grad():
            with_adapter, with_merged = adapted(ids).logits, merged(ids).logits
            alone = on_its_own(ids).logits
        if not torch.equal(alone, with_adapter):
            failures.append("AutoPeftModelForCausalLM on the adapter folder alone gives other logits than PeftModel")
        scale = with_adapter.abs().max().item()
        difference = (with_adapter - with_merged).abs().max().item()
        moved = (with_adapter - before).abs().max().item()
        print(f"PEFT's logits against the merged weights' {difference:.2e}, against the checkpoint's {moved:.2e}")
        if difference > 1e-5 * scale:
            failures.append(f"PEFT with the adapter and transformers with the merged weights differ by {difference}")
        if moved <= 1e-3 * scale:
            failures.append(f"the fine-tuned logits are within {moved} of the checkpoint's")

        config.write_text(RUN_FILE.format(model=model, enable="false"))
        disabled = subprocess.run(command(root / "disabled", "--train.steps=1", "--train.lr.warmup_steps=0",
                                          "--train.lr.decay_steps=0"), capture_output=True, text=True)
        if disabled.returncode != 0 or disabled.stdout.count("enable is false: no LoRA is applied") != 1:
            failures.append(f"enable: false was not said once: {disabled.stdout[-1500:]}{disabled.stderr[-800:]}")
        config.write_text(RUN_FILE.format(model=model, enable="true"))
        short = subprocess.run([loom_run, "--nproc-per-node", "2", "--", recipe, "--config", str(config), "--tokens",
                                str(tokens), "--batch_size", "16", "--seq_len", "128", f"--train.out={root / 'short'}"],
                               capture_output=True, text=True)
        if (short.returncode == 0 or "the held-out last tenth of --tokens" not in short.stderr
                or "give a longer token file, a shorter --seq-len or a smaller --batch-size" not in short.stderr
                or "build:" in short.stdout):
            failures.append(f"too little held-out data was not refused before the build, naming the knobs: "
                            f"{short.stdout[-800:]}{short.stderr[-800:]}")
        bad = root / "bad.bin"  # an llm.c header for three uint16 tokens, one of them beyond the vocabulary
        bad.write_bytes(b"".join(v.to_bytes(4, "little") for v in [20240520, 1, 3] + [0] * 253)
                        + b"".join(v.to_bytes(2, "little") for v in (7, 300, 9)))
        refused = subprocess.run([loom_run, "--nproc-per-node", "2", "--", recipe, "--config", str(config),
                                  "--tokens", str(bad)], capture_output=True, text=True)
        if refused.returncode == 0 or "token 1 is id 300, not below the model's vocab_size 256" not in refused.stderr:
            failures.append(f"a token beyond the vocabulary was not refused by name: {refused.stderr[-800:]}")
    for failure in failures:
        print("FAIL:", failure)
    print("lm-finetune:", "ok" if not failures else f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""finetune, the example that trains from a run file alone: it runs with dotted overrides, and a run
file or override that breaks a rule, or gives the loop a value it refuses, stops it before anything is
built, with the compiler's sentence or the option's.

    finetune_check.py LOOM_RUN FINETUNE CONFIG
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> int:
    loom_run, finetune, config = sys.argv[1:4]
    failures = []

    def run(*overrides: str) -> subprocess.CompletedProcess:
        return subprocess.run([loom_run, "--nproc-per-node", "2", "--", finetune, "--config", config, *overrides],
                              capture_output=True, text=True)

    with tempfile.TemporaryDirectory() as out:
        done = run(f"--train.out={out}", "--train.steps=6", "--train.eval_every=3", "--train.log_every=2",
                   "--train.lr.warmup_steps=1", "--train.lr.decay_steps=2", "--lora.rank=4", "--strategy=DDP")
        if done.returncode != 0:
            failures.append(f"the run with overrides failed:\n{done.stdout[-1500:]}{done.stderr[-1500:]}")
        else:
            lines = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
            if [line["step"] for line in lines if "loss" in line] != [1, 2, 4, 6]:
                failures.append(f"metrics.jsonl has the steps {[line.get('step') for line in lines]}")
            if not (Path(out) / "adapter" / "adapter_config.json").exists():
                failures.append("no adapter was saved")
            if "lora(rank=4," not in done.stdout or "ddp(bucket_cap_mb=25" not in done.stdout:
                failures.append("the overrides do not show in the plan's description")
    for overrides, sentence in ((["--lora.rank=0"], "loom R5: lora rank must be > 0"),
                                (["--strategy=zero3"], "unknown strategy 'zero3'; the strategies are local, ddp, fsdp"),
                                (["--lora.rnak=4"], "lora.rnak: unknown key"),
                                (["--train.steps=0"], "train.steps: is 0; give at least 1"),
                                (["--train.accumulate=0"], "train.accumulate: is 0; give at least 1")):
        refused = run(*overrides)
        if refused.returncode == 0 or sentence not in refused.stderr:
            failures.append(f"{overrides} gave {refused.returncode}: {refused.stderr[-600:]}")
        if "lora(rank=" in refused.stdout:  # the built job's description: it was refused too late
            failures.append(f"{overrides} was refused after the job was built")
    helped = subprocess.run([finetune, "--help"], capture_output=True, text=True)
    if helped.returncode != 0 or "--config" not in helped.stdout or "--lora.rank=16" not in helped.stdout:
        failures.append("finetune --help does not print its usage and exit 0")
    for failure in failures:
        print("FAIL:", failure)
    for words, sentence in ((["--config", config, "--lora.rank"], "--lora.rank needs a value"),
                            (["--config", config, "stray"], "'stray' is not an override"),
                            (["--config", "/nonexistent.toml"], "--config: File does not exist"),
                            ([], "--config is required")):
        refused = subprocess.run([finetune, *words], capture_output=True, text=True)
        if refused.returncode != 2 or sentence not in refused.stderr:
            failures.append(f"finetune {words} gave {refused.returncode}: {refused.stderr[-600:]}")
    print("finetune:", "ok" if not failures else f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

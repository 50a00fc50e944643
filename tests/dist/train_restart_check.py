#!/usr/bin/env python3
"""loom::train under loom-run --max-restarts 2, its checkpoints written in the background: a rank
SIGKILLed once in the optimizer's step of step 50 (after the checkpoint of step 40) restarts the
job, which resumes from step 40 by itself and ends with the adapter an uninterrupted run writes,
byte for byte.

    train_restart_check.py LOOM_RUN FINETUNE CONFIG RANKS
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from adapter_files import adapter_differences  # noqa: E402


def command(loom_run: str, finetune: str, config: str, ranks: str, out: Path) -> list[str]:
    return [loom_run, "--nproc-per-node", ranks, "--max-restarts", "2", "--", finetune, "--config", config,
            f"--train.out={out}", "--train.steps=80", "--train.checkpoint_every=20", "--train.eval_every=0",
            "--train.log_every=10", "--train.lr.warmup_steps=5", "--train.lr.decay_steps=40", "--lora.rank=4",
            "--train.async_checkpoints=true"]


def main() -> int:
    loom_run, finetune, config, ranks = sys.argv[1:5]
    failures = []
    with tempfile.TemporaryDirectory() as root:
        straight = Path(root) / "straight"
        done = subprocess.run(command(loom_run, finetune, config, ranks, straight), capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stdout[-2000:], done.stderr[-2000:])
            return 1
        out = Path(root) / "restarted"
        env = {**os.environ, "LOOM_FAILPOINT": "step.optimizer", "LOOM_FAILPOINT_HIT": "50",
               "LOOM_FAILPOINT_RANK": "1", "LOOM_FAILPOINT_RESTART": "0"}
        run = subprocess.run(command(loom_run, finetune, config, ranks, out), capture_output=True, text=True, env=env)
        said = run.stdout + run.stderr
        if run.returncode != 0 or "restart 1 of 2" not in said or "(step 40)" not in run.stdout:
            failures.append(f"not restarted and resumed from step 40 ({run.returncode}): {said[-2500:]}")
        else:
            failures += adapter_differences(straight, out)
            print(f"{ranks} ranks: killed at step 50, restarted, resumed from step 40, the same adapter")
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""SIGTERM (or SIGINT) to loom-run in the middle of a training run, as a cluster's scheduler sends it
before the kill: every rank finishes the step under way, writes a checkpoint and stops; loom-run
exits 75 ("resumable") within a few seconds; the same command then resumes from that checkpoint and
ends with the adapter an uninterrupted run writes, byte for byte.

    preempt_check.py LOOM_RUN FINETUNE CONFIG RANKS [STRATEGY]   (fsdp, as the run file says, or ddp)
"""
from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from adapter_files import adapter_differences  # noqa: E402


def command(loom_run: str, finetune: str, config: str, ranks: str, out: Path, strategy: str) -> list[str]:
    return [loom_run, "--nproc-per-node", ranks, "--", finetune, "--config", config, f"--train.out={out}",
            "--train.steps=120", "--train.checkpoint_every=1000", "--train.eval_every=0", "--train.log_every=1",
            "--train.lr.warmup_steps=5", "--train.lr.decay_steps=60", "--lora.rank=4", f"--strategy={strategy}"]


def main() -> int:
    loom_run, finetune, config, ranks = sys.argv[1:5]
    strategy = sys.argv[5] if len(sys.argv) > 5 else "fsdp"
    failures = []
    with tempfile.TemporaryDirectory() as root:
        straight = Path(root) / "straight"
        done = subprocess.run(command(loom_run, finetune, config, ranks, straight, strategy), capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stdout[-2000:], done.stderr[-2000:])
            return 1
        for name, number in (("SIGTERM", signal.SIGTERM), ("SIGINT", signal.SIGINT)):
            out = Path(root) / name
            run = subprocess.Popen(command(loom_run, finetune, config, ranks, out, strategy), stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
            for line in run.stdout:
                if "finetune step    10/120" in line:
                    break
            sent = time.monotonic()
            run.send_signal(number)
            rest = run.stdout.read()
            code = run.wait()
            took = time.monotonic() - sent
            if code != 75 or took > 10:
                failures.append(f"{name}: loom-run exited {code} after {took:.1f} s, expected 75 within 10 s:\n"
                                f"{rest[-1500:]}")
                continue
            saved = sorted(p.name for p in (out / "checkpoints").iterdir())
            if len(saved) != 1 or saved[0] == "step-00000120":
                failures.append(f"{name}: expected one preemption checkpoint before step 120, found {saved}")
                continue
            resumed = subprocess.run(command(loom_run, finetune, config, ranks, out, strategy), capture_output=True, text=True)
            step = int(saved[0].split("-")[1])
            if resumed.returncode != 0 or f"(step {step})" not in resumed.stdout:
                failures.append(f"{name}: the relaunch did not resume from step {step}: {resumed.stdout[-800:]}"
                                f"{resumed.stderr[-800:]}")
                continue
            failures += [f"{name}: {line}" for line in adapter_differences(straight, out)]
            print(f"{name}: stopped after step {step} in {took:.1f} s with exit 75, resumed, same adapter")
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

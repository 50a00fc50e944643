#!/usr/bin/env python3
"""A rank killed by SIGKILL in the forward, in the backward (its peers in the step's all-reduce or
reduce-scatter), before the clipping (its peers in the norm's all-reduce, which loom::train issues
outside any pass) or at the optimizer's step, under ddp(), fsdp() and lora | fsdp(): loom-run names
the rank and its signal, every rank is down within --grace-s + 5 s of the launch (an upper bound on
the time from the death), no process of the job is left behind, and what a surviving rank says is
loom's sentence, not the transport's raw words.

    rank_death_check.py LOOM_RUN DEVICE_PARITY RANKS
"""
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GRACE_S = 3
POINTS = {"step.forward": "3", "step.backward": "1", "step.clip": "2", "step.optimizer": "2"}  # failpoint: the pass it fires at


def survivors(marker: str) -> list[str]:
    found = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    return found.stdout.split()


def main() -> int:
    loom_run, program, ranks = sys.argv[1], sys.argv[2], sys.argv[3]
    victim = str(int(ranks) - 1) if ranks == "2" else "1"  # the last rank, or one in the middle
    failures = []
    with tempfile.TemporaryDirectory() as root:
        for strategy in ("ddp", "fsdp", "lora-fsdp"):
            for point, hit in POINTS.items():
                out = Path(root) / f"{strategy}-{point}.safetensors"  # unique: it marks the job's processes
                env = dict(os.environ, LOOM_FAILPOINT=point, LOOM_FAILPOINT_HIT=hit, LOOM_FAILPOINT_RANK=victim)
                start = time.monotonic()
                done = subprocess.run([loom_run, "--grace-s", str(GRACE_S), "--nproc-per-node", ranks, "--", program,
                                       strategy, str(out), "20"], env=env, capture_output=True, text=True, timeout=120)
                took = time.monotonic() - start
                last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
                case = f"{strategy}, rank {victim} of {ranks} killed at {point}"
                if done.returncode != 1 or f"rank {victim} failed first: killed by signal 9 (SIGKILL)" not in last:
                    failures.append(f"{case}: exit {done.returncode}, last line '{last}'")
                if took > GRACE_S + 5:
                    failures.append(f"{case}: the job took {took:.1f} s to end, more than --grace-s + 5")
                raw = [line for line in done.stderr.splitlines()
                       if "device-parity: " in line and "device-parity: loom: " not in line]
                if raw:
                    failures.append(f"{case}: a rank's error is not loom's: '{raw[0][:200]}'")
                if survivors(str(out)):
                    failures.append(f"{case}: processes left behind: {survivors(str(out))}")
                print(f"{case}: down in {took:.1f} s; {last}")
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

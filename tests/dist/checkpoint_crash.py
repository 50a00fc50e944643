#!/usr/bin/env python3
"""A rank killed (SIGKILL) in the middle of a checkpoint save, at each point of it: the next launch
resumes from the newest complete checkpoint, the interrupted save's leftovers are gone, and the run
ends with the parameters and optimizer state of a run that was never interrupted, bit for bit.

    checkpoint_crash.py --loom-run LOOM_RUN --program DIST_RESUME --ranks N --strategy S
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

# (failpoint, the rank it kills, the step the next launch resumes from). Checkpoints come at steps
# 4 and 8; each failpoint fires at its second pass, in the save of step 8.
POINTS = [
    ("checkpoint.before-shard", 1, 4),
    ("safetensors.after-header", 1, 4),  # its file half written
    ("checkpoint.after-shard", 1, 4),
    ("checkpoint.before-manifest", 0, 4),
    ("checkpoint.after-manifest", 0, 4),  # complete but not renamed: not a checkpoint yet
    ("checkpoint.after-rename", 0, 8),
]


def launch(args, folder: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([args.loom_run, "--nproc-per-node", str(args.ranks), "--", args.program, args.strategy,
                           str(folder), "8"], env={**os.environ, **(env or {})}, capture_output=True, text=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    for flag in ("--loom-run", "--program", "--strategy"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--ranks", type=int, required=True)
    args = parser.parse_args()
    failures = []
    with tempfile.TemporaryDirectory() as root:
        straight = Path(root) / "straight"
        if launch(args, straight).returncode != 0:
            print("FAIL: the uninterrupted run failed")
            return 1
        for point, rank, resume_step in POINTS:
            folder = Path(root) / point
            crashed = launch(args, folder, {"LOOM_FAILPOINT": point, "LOOM_FAILPOINT_HIT": "2",
                                            "LOOM_FAILPOINT_RANK": str(rank)})
            if crashed.returncode == 0 or "SIGKILL" not in crashed.stderr + crashed.stdout:
                failures.append(f"{point}: rank {rank} was not killed ({crashed.returncode}): {crashed.stderr[-500:]}")
                continue
            resumed = launch(args, folder)
            if resumed.returncode != 0:
                failures.append(f"{point}: the relaunch failed: {resumed.stderr[-1500:]}")
                continue
            leftovers = [p.name for p in (folder / "checkpoints").iterdir() if p.name.endswith(".tmp")]
            if leftovers:
                failures.append(f"{point}: leftovers remain: {leftovers}")
            if f"resumed from step {resume_step}" not in resumed.stdout:
                failures.append(f"{point}: expected to resume from step {resume_step}: {resumed.stdout[-300:]}")
            for r in range(args.ranks):
                a = load_file(straight / f"final-rank-{r}.safetensors")
                b = load_file(folder / f"final-rank-{r}.safetensors")
                differ = [name for name in a if name not in b or not torch.equal(a[name], b[name])]
                if differ or a.keys() != b.keys():
                    failures.append(f"{point}: rank {r}: {len(differ)} tensors differ from the uninterrupted run")
            print(f"{point} on rank {rank}: killed, relaunched, resumed from step {resume_step}")
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

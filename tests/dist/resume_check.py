#!/usr/bin/env python3
"""8 steps straight against 4 steps, process exit, a new launch that resumes, 4 more steps: the
parameters and the optimizer's state must be equal bit for bit.

    resume_check.py --loom-run LOOM_RUN --program DIST_RESUME --ranks N --strategy S
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file


def launch(args, folder: Path, *extra: str) -> None:
    subprocess.run([args.loom_run, "--nproc-per-node", str(args.ranks), "--", args.program, args.strategy, str(folder),
                    "8", *extra], check=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    for flag in ("--loom-run", "--program", "--strategy"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--ranks", type=int, required=True)
    args = parser.parse_args()
    failures = []
    with tempfile.TemporaryDirectory() as root:
        straight, resumed = Path(root) / "straight", Path(root) / "resumed"
        launch(args, straight)
        launch(args, resumed, "4")
        checkpoints = sorted(p.name for p in (resumed / "checkpoints").iterdir())
        if checkpoints != ["step-00000004"]:
            failures.append(f"after the first half the checkpoints are {checkpoints}")
        launch(args, resumed)
        kept = sorted(p.name for p in (resumed / "checkpoints").iterdir())
        if kept != ["step-00000004", "step-00000008"]:
            failures.append(f"after the second half the checkpoints are {kept}")
        for rank in range(args.ranks):
            a = load_file(straight / f"final-rank-{rank}.safetensors")
            b = load_file(resumed / f"final-rank-{rank}.safetensors")
            if a.keys() != b.keys():
                failures.append(f"rank {rank}: the final states hold different names")
                continue
            differ = [name for name in a if not torch.equal(a[name], b[name])]
            if differ:
                failures.append(f"rank {rank}: {len(differ)} of {len(a)} tensors differ, e.g. {differ[:3]}")
            print(f"rank {rank}: {len(a) - len(differ)} of {len(a)} tensors equal bit for bit")
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

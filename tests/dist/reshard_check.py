#!/usr/bin/env python3
"""A checkpoint saved under fsdp() over N ranks resumes over M, for N = 2 and 3 and M = 1, 2 and 3:
right after the load, the whole model and AdamW's moments and steps (gathered from the shards)
are those of the run that resumed over N within 1e-6; after 2 more steps on the same global
batches they agree within 1e-3 (the runs differ in the order their sums are taken, which AdamW's
normalisation magnifies where a gradient is near zero).

    reshard_check.py --loom-run LOOM_RUN --program DIST_RESHARD --strategy S
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file


def launch(args, ranks: int, *rest: str) -> None:
    subprocess.run([args.loom_run, "--nproc-per-node", str(ranks), "--", args.program, args.strategy, *rest],
                   check=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    for flag in ("--loom-run", "--program", "--strategy"):
        parser.add_argument(flag, required=True)
    args = parser.parse_args()
    failures = []
    with tempfile.TemporaryDirectory() as root:
        for saved in (2, 3):
            folder = Path(root) / f"saved-at-{saved}"
            launch(args, saved, "save", str(folder))
            loaded, stepped = {}, {}
            for ranks in (saved, 1, 2, 3):
                out = Path(root) / f"from-{saved}-at-{ranks}.safetensors"
                launch(args, ranks, "continue", str(folder), str(out))
                loaded[ranks] = load_file(f"{out}.loaded")
                stepped[ranks] = load_file(out)
            for when, results, tolerance in (("after the load", loaded, 1e-6), ("2 steps later", stepped, 1e-3)):
                reference = results[saved]
                for ranks, state in results.items():
                    worst = max((state[name] - reference[name]).abs().max().item() for name in reference)
                    print(f"saved at {saved} ranks, resumed at {ranks}, {when}: largest difference {worst:.2g}")
                    if state.keys() != reference.keys() or worst > tolerance:
                        failures.append(f"saved at {saved}, resumed at {ranks}, {when}: differs by {worst}")
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

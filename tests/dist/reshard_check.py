#!/usr/bin/env python3
"""A checkpoint saved under fsdp() over N ranks resumes over M, for N = 2 and 3 and M = 1, 2 and 3
(with --hybrid: saved over 4 ranks in shard groups of 2, resumed in groups of 2 and of every rank
at 4, in groups of 2 and 3 at 6, and under plain fsdp() at 2 and 1; with --tensor-parallel, the
program dist-tensor-parallel-reshard: saved over 4 ranks in tensor_parallel(2) and over 2 unsplit,
resumed in tensor_parallel 1, 2 and 4 at 4 ranks, 1 and 2 at 2, and at 1):
right after the load, the whole model and AdamW's moments and steps (gathered from the shards)
are those of the run that resumed over N within 1e-6; after 2 more steps on the same global
batches they agree within 1e-3 (the runs differ in the order their sums are taken, which AdamW's
normalisation magnifies where a gradient is near zero).

    reshard_check.py --loom-run LOOM_RUN --program DIST_RESHARD --strategy S [--hybrid | --tensor-parallel]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file


def launch(args, ranks: int, group: int, *rest: str) -> None:
    strategy = f"{args.strategy}:{group}" if group else args.strategy
    subprocess.run([args.loom_run, "--nproc-per-node", str(ranks), "--", args.program, strategy, *rest], check=True)


# (ranks, shard group size; 0: every rank): where each checkpoint is saved, and where it resumes.
PLAIN = [((saved, 0), [(saved, 0), (1, 0), (2, 0), (3, 0)]) for saved in (2, 3)]
HYBRID = [((4, 2), [(4, 2), (4, 0), (6, 2), (6, 3), (2, 0), (1, 0)])]
# (ranks, tensor_parallel's size), the first of each list the saved layout.
TENSOR_PARALLEL = [((4, 2), [(4, 2), (4, 4), (4, 1), (2, 2), (2, 1), (1, 1)]),
                   ((2, 1), [(2, 1), (2, 2), (4, 4)])]


def layout_name_of(layout: tuple[int, int], tensor_parallel: bool) -> str:
    ranks, second = layout
    if tensor_parallel:
        return f"{ranks} ranks in tensor_parallel({second})"
    return f"{ranks} ranks" + (f" in groups of {second}" if second else "")


def main() -> int:
    parser = argparse.ArgumentParser()
    for flag in ("--loom-run", "--program", "--strategy"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--hybrid", action="store_true")
    parser.add_argument("--tensor-parallel", action="store_true")
    args = parser.parse_args()
    failures = []
    layouts = TENSOR_PARALLEL if args.tensor_parallel else HYBRID if args.hybrid else PLAIN

    def layout_name(layout):
        return layout_name_of(layout, args.tensor_parallel)

    with tempfile.TemporaryDirectory() as root:
        for saved, resumed in layouts:
            folder = Path(root) / f"saved-at-{layout_name(saved)}"
            launch(args, *saved, "save", str(folder))
            loaded, stepped = {}, {}
            for layout in resumed:
                out = Path(root) / f"from-{layout_name(saved)}-at-{layout_name(layout)}.safetensors"
                launch(args, *layout, "continue", str(folder), str(out))
                loaded[layout_name(layout)] = load_file(f"{out}.loaded")
                stepped[layout_name(layout)] = load_file(out)
            # Split layers sum in the same order at any k here, so tensor_parallel's runs agree to fp32 rounding.
            later = 1e-5 if args.tensor_parallel else 1e-3
            for when, results, tolerance in (("after the load", loaded, 1e-6), ("2 steps later", stepped, later)):
                reference = results[layout_name(saved)]
                for name, state in results.items():
                    worst = max((state[key] - reference[key]).abs().max().item() for key in reference)
                    print(f"saved at {layout_name(saved)}, resumed at {name}, {when}: largest difference {worst:.2g}")
                    if state.keys() != reference.keys() or worst > tolerance:
                        failures.append(f"saved at {layout_name(saved)}, resumed at {name}, {when}: differs by {worst}")
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

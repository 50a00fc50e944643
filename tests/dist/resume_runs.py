"""Runs of dist-resume under loom-run, as resume_check.py and checkpoint_crash.py start them, and
what they leave in a run's folder: each rank's final-rank-R.safetensors (the whole model and its
optimizer's state)."""
from __future__ import annotations

import argparse
import os
import subprocess
from pathlib import Path

import torch
from safetensors.torch import load_file


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    for flag in ("--loom-run", "--program", "--strategy"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--ranks", type=int, required=True)
    parser.add_argument("--async", dest="async_save", action="store_true", help="save on a background thread")
    return parser.parse_args()


def launch(args: argparse.Namespace, folder: Path, *extra: str, env: dict[str, str] | None = None,
           launcher: tuple[str, ...] = ()):
    """8 steps of dist-resume in `folder` (resuming from its checkpoints), `extra` passed on, and
    `launcher` to loom-run."""
    mode = ["--async"] if args.async_save else []
    return subprocess.run([args.loom_run, "--nproc-per-node", str(args.ranks), *launcher, "--", args.program,
                           args.strategy,
                           str(folder), "8", *extra, *mode], env={**os.environ, **(env or {})}, capture_output=True,
                          text=True)


def succeeded(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """`result`, or the end of the test with its output when the launch failed."""
    if result.returncode != 0:
        raise SystemExit(f"FAIL: {' '.join(result.args)} ended with {result.returncode}:\n"
                         f"{result.stdout[-2000:]}{result.stderr[-2000:]}")
    return result


def differences(expected: Path, actual: Path, ranks: int) -> list[str]:
    """One line per rank whose final state in `actual` is not bit for bit the one in `expected`."""
    found = []
    for rank in range(ranks):
        a = load_file(expected / f"final-rank-{rank}.safetensors")
        b = load_file(actual / f"final-rank-{rank}.safetensors")
        differ = [name for name in a if name not in b or not torch.equal(a[name], b[name])]
        if differ or a.keys() != b.keys():
            found.append(f"rank {rank}: {len(differ)} of {len(a)} tensors differ (or the names do), e.g. {differ[:3]}")
    return found

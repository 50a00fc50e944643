"""What the checks against Hugging Face's models share: the driver's command line, the strategies a
rank count is checked under, and running the check's loom program under loom-run, which records a
failed run and a rank that read more of the checkpoint than its share (pretrained(...) reads a
rank's shards under fsdp(), about 1/N of the bytes; hybrid sharding's 1/2 at 4 ranks; all of them
otherwise).
"""
from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path


def driver_arguments() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom-run", required=True)
    ap.add_argument("--program", required=True)
    ap.add_argument("--ranks", type=int, required=True)
    return ap.parse_args()


def strategies(ranks: int, hybrid: bool = False) -> list[str]:
    """local() alone at 1 rank; ddp() and fsdp() above it, and with `hybrid` hybrid sharding in groups
    of 2 ranks (hsdp) at 4."""
    if ranks == 1:
        return ["local"]
    return ["ddp", "fsdp"] + (["hsdp"] if hybrid and ranks == 4 else [])


# The ranks each rank's shard of the checkpoint is one of, by strategy; absent: it reads all of it.
SHARDED_OVER = {"fsdp": lambda ranks: ranks, "hsdp": lambda ranks: 2}


class LoomRuns:
    """Runs `program CHECKPOINT STRATEGY ...` under loom-run on `ranks` ranks; `failures` lists what failed."""

    def __init__(self, args: argparse.Namespace):
        self.loom_run, self.program, self.ranks = args.loom_run, args.program, args.ranks
        self.failures: list[str] = []

    def __call__(self, checkpoint: Path, strategy: str, *extra: str) -> bool:
        command = [self.loom_run, "--nproc-per-node", str(self.ranks), "--", self.program, str(checkpoint), strategy,
                   *extra]
        what = f"{' '.join([strategy, *extra])} on {checkpoint.name}"
        print("$", " ".join(command), flush=True)
        done = subprocess.run(command, timeout=120, capture_output=True, text=True)
        print(done.stdout, done.stderr, end="", flush=True)
        if done.returncode != 0:
            self.failures.append(what)
            return False
        sharded_over = SHARDED_OVER[strategy](self.ranks) if strategy in SHARDED_OVER else None
        for read, total in re.findall(r"(\d+) of their (\d+) bytes read on this rank", done.stdout):
            read, total = int(read), int(total)
            share = total / sharded_over if sharded_over else total
            if not (0 < read <= share * 1.25 and (sharded_over or read == total)):
                self.failures.append(f"{what}: a rank read {read} of {total} bytes")
        return True

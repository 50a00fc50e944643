"""What bench/compare, bench/ab and bench/perf_account share: how many ranks a workload runs on, which
anchor runs it, and one benchmark run's JSON line (loom-bench's, or an anchor's)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

# The model families of ../shared/BENCHMARKS.md's "Real models", which hf_anchor.py runs; the toy
# workloads (mlp-*, gpt-*) are torch_anchor.py's.
REAL_FAMILIES = ("llama", "wan")


def ranks_for(workload: str) -> int:
    if workload.endswith("-hsdp"):
        return 4
    return 2 if workload.endswith(("-ddp", "-fsdp")) else 1


def family(workload: str) -> str:
    """The model a workload trains: the part of its name before the first '-' (llama, wan, gpt, mlp)."""
    return workload.split("-", 1)[0]


def anchor_script(root: Path, workload: str) -> Path:
    """The anchor of `workload`, beside the repository `root` in ../shared/bench/."""
    real = family(workload) in REAL_FAMILIES
    return root.parent / "shared" / "bench" / ("hf_anchor.py" if real else "torch_anchor.py")


def run_once(command: list[str], timeout_s: float, env: dict[str, str] | None = None) -> dict:
    """Runs one benchmark and returns its JSON line; raises RuntimeError with its output otherwise."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=env)
    for line in reversed(done.stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    raise RuntimeError(f"{' '.join(command)} exited {done.returncode} without a JSON line:\n"
                       f"{done.stdout[-2000:]}{done.stderr[-2000:]}")

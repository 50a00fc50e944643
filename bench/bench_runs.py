"""What bench/compare and bench/ab share: how many ranks a workload runs on, and one benchmark run's
JSON line (loom-bench's, or an anchor's)."""
from __future__ import annotations

import json
import subprocess


def ranks_for(workload: str) -> int:
    if workload.endswith("-hsdp"):
        return 4
    return 2 if workload.endswith(("-ddp", "-fsdp")) else 1


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

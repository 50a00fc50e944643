#!/usr/bin/env python3
"""8 ranks on a small machine (2 cores in CI) run 20 steps of loom-bench's gpt-ddp and gpt-fsdp to
the end with the default timeouts (LOOM_TIMEOUT_S unset), and the slowest step any rank saw is set
against that timeout. A step's wall time bounds every collective wait inside it, so the ratio is the
margin a loaded machine leaves before a timeout would stop a healthy job.

    load_check.py LOOM_RUN LOOM_BENCH LAUNCH_ENV_HPP

LAUNCH_ENV_HPP is include/loom/runtime/launch_env.hpp, which holds the default timeout.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

RANKS = "8"
STEPS = "20"
WORKLOADS = ("gpt-ddp", "gpt-fsdp")


def default_timeout_s(header: Path) -> float:
    found = re.search(r"default_timeout\{std::chrono::seconds\((\d+)\)\}", header.read_text())
    if not found:
        raise SystemExit(f"load_check: no `default_timeout{{std::chrono::seconds(N)}}` in {header}")
    return float(found.group(1))


def main() -> int:
    loom_run, bench, header = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    timeout_s = default_timeout_s(header)
    env = {name: value for name, value in os.environ.items() if name != "LOOM_TIMEOUT_S"}  # Meson's dist_env sets 20
    failures = []
    print(f"{os.cpu_count()} cores, {RANKS} ranks, {STEPS} steps, the default timeout {timeout_s:g} s")
    for workload in WORKLOADS:
        start = time.monotonic()
        done = subprocess.run([loom_run, "--no-prefix", "--nproc-per-node", RANKS, "--", bench, "--workload", workload,
                               "--steps", STEPS, "--warmup", "0"], env=env, capture_output=True, text=True,
                              timeout=240)
        took = time.monotonic() - start
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode != 0 or not lines:
            failures.append(f"{workload}: loom-run exited {done.returncode} after {took:.1f} s:\n"
                            f"{done.stdout[-1500:]}{done.stderr[-1500:]}")
            continue
        result = json.loads(lines[-1])
        slowest_s = result["step_ms_max"] / 1000
        print(f"{workload}: {result['world']} ranks ran {result['steps']} steps in {took:.1f} s (start-up included); "
              f"median step {result['step_ms_median'] / 1000:.2f} s, slowest {slowest_s:.2f} s, "
              f"{slowest_s / timeout_s:.2%} of the {timeout_s:g} s timeout")
        if result["world"] != int(RANKS) or result["steps"] != int(STEPS):
            failures.append(f"{workload}: expected {RANKS} ranks and {STEPS} steps, got {lines[-1]}")
        if slowest_s > timeout_s / 2:
            failures.append(f"{workload}: the slowest step took {slowest_s:.1f} s, more than half the timeout: the "
                            f"margin that keeps a loaded machine's job alive is gone")
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

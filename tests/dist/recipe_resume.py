#!/usr/bin/env python3
"""The flagship recipe killed in the middle of its second phase (rank 0, right after a checkpoint)
and started again with the same --out: it skips the first phase, resumes the second from the
newest checkpoint, and writes the same adapter and adapted weights, byte for byte, as a run left
alone (the adapter's config names each run's own pretrained folder as its base model: else equal).

    recipe_resume.py LOOM_RUN TINY_GPT
"""
from __future__ import annotations

import filecmp
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# 50 + 60 steps, a checkpoint every 20: phase 1 saves at 20, 40 and 50, phase 2 at 20, 40 and 60;
# the 5th save is phase 2's step 40.
ARGS = ["--steps-pretrain", "50", "--steps-adapt", "60", "--checkpoint-every", "20"]


def run(loom_run: str, recipe: str, out: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([loom_run, "--nproc-per-node", "2", "--", recipe, *ARGS, "--out", str(out)],
                          env={**os.environ, **(env or {})}, capture_output=True, text=True)


def main() -> int:
    loom_run, recipe = sys.argv[1], sys.argv[2]
    failures = []
    with tempfile.TemporaryDirectory() as root:
        stopped, straight = Path(root) / "stopped", Path(root) / "straight"
        killed = run(loom_run, recipe, stopped, {"LOOM_FAILPOINT": "checkpoint.after-rename", "LOOM_FAILPOINT_HIT": "5",
                                                 "LOOM_FAILPOINT_RANK": "0"})
        if killed.returncode == 0:
            failures.append("the first run was not killed")
        again = run(loom_run, recipe, stopped)
        for expected in ("phase 1: done already", "adapt: resumed from", "step-00000040 (step 40)"):
            if expected not in again.stdout:
                failures.append(f"the second run does not say '{expected}':\n{again.stdout[-1500:]}{again.stderr[-1500:]}")
        if run(loom_run, recipe, straight).returncode != 0:
            failures.append("the run left alone failed")
        for file in ("adapter/adapter_model.safetensors", "adapted/model.safetensors"):
            if not (stopped / file).exists() or not filecmp.cmp(stopped / file, straight / file, shallow=False):
                failures.append(f"{file} differs from the run left alone")
        configs = {}
        for out in (stopped, straight):
            config = json.loads((out / "adapter" / "adapter_config.json").read_text())
            if config.pop("base_model_name_or_path") != str((out / "pretrained").resolve()):
                failures.append(f"{out.name}'s adapter does not name its pretrained folder as its base model")
            configs[out] = config
        if configs[stopped] != configs[straight]:
            failures.append("adapter/adapter_config.json differs from the run left alone")
    for failure in failures:
        print("FAIL:", failure)
    print("recipe resume:", "ok" if not failures else f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

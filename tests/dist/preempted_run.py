"""A recipe's run preempted and launched again, as a cluster's scheduler does it: SIGTERM to loom-run
once the run prints a line, the exit status that asks for a relaunch (75), the same command again,
and the adapter it ends with against an uninterrupted run's, byte for byte. lm_finetune_check.py,
lm_chat_check.py and wan_finetune_check.py use it."""
from __future__ import annotations

import filecmp
import re
import signal
import subprocess
from pathlib import Path


def preempted_and_resumed(command: list[str], stop_at: str, out: Path, straight: Path,
                          same: tuple[str, ...] = ("adapter/adapter_model.safetensors",
                                                   "adapter/adapter_config.json")) -> list[str]:
    """Runs `command` (writing into `out`), stops it by SIGTERM when a line matches `stop_at`, runs it
    again, and returns what went wrong: the exit status, no resume, a file of `same` (paths in the run
    folder) unlike `straight`'s."""
    failures = []
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in run.stdout:
        if re.search(stop_at, line):
            break
    run.send_signal(signal.SIGTERM)
    rest = run.stdout.read()
    if run.wait() != 75:
        failures.append(f"SIGTERM did not end the run resumable (75): {rest[-1500:]}")
    resumed = subprocess.run(command, capture_output=True, text=True)
    if resumed.returncode != 0 or "resumed from" not in resumed.stdout:
        failures.append(f"the relaunch did not resume: {resumed.stdout[-1500:]}{resumed.stderr[-1500:]}")
    for name in same:
        if not (out / name).is_file() or not filecmp.cmp(straight / name, out / name, shallow=False):
            failures.append(f"the resumed run's {name} differs from the uninterrupted run's")
    return failures

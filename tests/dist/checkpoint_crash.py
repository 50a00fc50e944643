#!/usr/bin/env python3
"""A rank killed (SIGKILL) in the middle of a checkpoint save, at each point of it, or a disk that
fills up during one (ENOSPC when a rank's file is flushed): the next launch resumes from the newest
complete checkpoint, the interrupted save's leftovers are gone, and the run ends with the
parameters and optimizer state of a run that was never interrupted, bit for bit.

    checkpoint_crash.py --loom-run LOOM_RUN --program DIST_RESUME --ranks N --strategy S [--async]

With --async the saves write on a background thread: the first three points then kill a rank in
that thread, its file half written while training goes on, and the full disk surfaces at the step
that completes the save.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from resume_runs import arguments, differences, launch, succeeded  # noqa: E402

# (failpoint, the rank it kills, the step the next launch resumes from). Checkpoints come at steps
# 4 and 8; each failpoint fires at its second pass, in the save of step 8.
POINTS = [
    ("checkpoint.before-shard", 1, 4),
    ("safetensors.after-header", 1, 4),  # its file half written
    ("checkpoint.after-shard", 1, 4),
    ("checkpoint.before-manifest", 0, 4),
    ("checkpoint.after-manifest", 0, 4),  # complete but not renamed: not a checkpoint yet
    ("checkpoint.after-rename", 0, 8),
]


def main() -> int:
    args = arguments()
    failures = []
    with tempfile.TemporaryDirectory() as root:
        straight = Path(root) / "straight"
        succeeded(launch(args, straight))
        for point, rank, resume_step in POINTS:
            folder = Path(root) / point
            crashed = launch(args, folder, env={"LOOM_FAILPOINT": point, "LOOM_FAILPOINT_HIT": "2",
                                                "LOOM_FAILPOINT_RANK": str(rank)})
            if crashed.returncode == 0 or "SIGKILL" not in crashed.stderr + crashed.stdout:
                failures.append(f"{point}: rank {rank} was not killed ({crashed.returncode}): {crashed.stderr[-500:]}")
                continue
            resumed = launch(args, folder)
            if resumed.returncode != 0:
                failures.append(f"{point}: the relaunch failed: {resumed.stderr[-1500:]}")
                continue
            leftovers = [p.name for p in (folder / "checkpoints").iterdir() if p.name.endswith(".tmp")]
            if leftovers:
                failures.append(f"{point}: leftovers remain: {leftovers}")
            if f"resumed from step {resume_step}" not in resumed.stdout:
                failures.append(f"{point}: expected to resume from step {resume_step}: {resumed.stdout[-300:]}")
            failures += [f"{point}: {line}" for line in differences(straight, folder, args.ranks)]
            print(f"{point} on rank {rank}: killed, relaunched, resumed from step {resume_step}")

        # The disk fills up in the save of step 8: rank 1's file cannot be flushed (ENOSPC, injected).
        folder = Path(root) / "disk-full"
        full = launch(args, folder, env={"LOOM_FAILPOINT": "file.commit", "LOOM_FAILPOINT_HIT": "2",
                                         "LOOM_FAILPOINT_RANK": "1", "LOOM_FAILPOINT_ERRNO": "ENOSPC"})
        said = full.stdout + full.stderr
        if full.returncode == 0 or "No space left on device" not in said or "rank-00001.safetensors" not in said:
            failures.append(f"disk full: no clear error naming the file ({full.returncode}): {said[-1500:]}")
        elif "rank 1 failed" not in said.split("[rank 0]", 1)[-1]:
            failures.append(f"disk full: rank 0 does not name rank 1's failure: {said[-1500:]}")
        complete = sorted(p.name for p in (folder / "checkpoints").iterdir() if not p.name.endswith(".tmp"))
        if complete != ["step-00000004"]:
            failures.append(f"disk full: the checkpoints left are {complete}, not step 4's alone")
        resumed = launch(args, folder)
        if resumed.returncode != 0 or "resumed from step 4" not in resumed.stdout:
            failures.append(f"disk full: the relaunch did not resume from step 4: {resumed.stderr[-1500:]}")
        else:
            failures += [f"disk full: {line}" for line in differences(straight, folder, args.ranks)]
            print("disk full on rank 1 in the save of step 8: a clear error, step 4 intact, resumed")
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

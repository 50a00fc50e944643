#!/usr/bin/env python3
"""8 steps straight against 4 steps, process exit, a new launch that resumes, 4 more steps: the
parameters and the optimizer's state must be equal bit for bit.

    resume_check.py --loom-run LOOM_RUN --program DIST_RESUME --ranks N --strategy S
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from resume_runs import arguments, differences, launch, succeeded  # noqa: E402


def main() -> int:
    args = arguments()
    failures = []
    with tempfile.TemporaryDirectory() as root:
        straight, resumed = Path(root) / "straight", Path(root) / "resumed"
        succeeded(launch(args, straight))
        succeeded(launch(args, resumed, "4"))
        checkpoints = sorted(p.name for p in (resumed / "checkpoints").iterdir())
        if checkpoints != ["step-00000004"]:
            failures.append(f"after the first half the checkpoints are {checkpoints}")
        succeeded(launch(args, resumed))
        kept = sorted(p.name for p in (resumed / "checkpoints").iterdir())
        if kept != ["step-00000004", "step-00000008"]:
            failures.append(f"after the second half the checkpoints are {kept}")
        failures += differences(straight, resumed, args.ranks)
        print(f"{args.ranks} ranks: the resumed run's final states", "differ" if failures else "are bit for bit the same")
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

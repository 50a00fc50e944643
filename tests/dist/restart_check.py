#!/usr/bin/env python3
"""loom-run --max-restarts 2 as torchrun's elastic agent: a rank SIGKILLed once mid-training (at
step 6, after the checkpoint of step 4) is restarted with every other rank, the run resumes from
its checkpoint by itself and ends bit for bit where a run never interrupted ends. A rank killed in
every attempt (at step 2, before any checkpoint) ends the job after the third failure, naming it.

    restart_check.py --loom-run LOOM_RUN --program DIST_RESUME --ranks N --strategy S
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
    restarts = ("--max-restarts", "2")
    with tempfile.TemporaryDirectory() as root:
        straight = Path(root) / "straight"
        succeeded(launch(args, straight))

        once = Path(root) / "once"
        run = launch(args, once, launcher=restarts,
                     env={"LOOM_FAILPOINT": "step.forward", "LOOM_FAILPOINT_HIT": "6", "LOOM_FAILPOINT_RANK": "1",
                          "LOOM_FAILPOINT_RESTART": "0"})
        said = run.stdout + run.stderr
        restarted = "loom-run: rank 1 failed (killed by signal 9 (SIGKILL)): restarting all " \
                    f"{args.ranks} ranks, restart 1 of 2 (1 left after it)"
        if run.returncode != 0 or restarted not in said or "resumed from step 4" not in run.stdout:
            failures.append(f"killed once: not restarted and resumed ({run.returncode}): {said[-2000:]}")
        else:
            failures += [f"killed once: {line}" for line in differences(straight, once, args.ranks)]
            print("killed once at step 6: restarted, resumed from step 4, ended bit for bit")

        always = Path(root) / "always"
        run = launch(args, always, launcher=restarts,
                     env={"LOOM_FAILPOINT": "step.forward", "LOOM_FAILPOINT_HIT": "2", "LOOM_FAILPOINT_RANK": "1"})
        said = run.stdout + run.stderr
        last = run.stderr.strip().splitlines()[-1] if run.stderr.strip() else ""
        if run.returncode != 1 or said.count("restarting all") != 2 or last != (
                "loom-run: rank 1 failed first: killed by signal 9 (SIGKILL) (after 2 restarts, none left: "
                "--max-restarts 2)"):
            failures.append(f"killed every time: not ended after the third failure ({run.returncode}): {said[-2000:]}")
        else:
            print("killed in every attempt: ended after the third failure, naming it")
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""A text dataset's position in loom::train's checkpoints: runs of dist-data-resume (12 steps, a
checkpoint every 3) interrupted after the checkpoint of step 6 read, after their resume, exactly the
batches an uninterrupted run reads, and end in its state, bit for bit:

- a rank SIGKILLed in step 8, the job restarted by loom-run --max-restarts 1;
- a rank SIGKILLed in step 8, the job launched again by hand;
- SIGTERM to one rank in step 5: every rank stops after step 6 with a checkpoint and exits 75, and
  the next launch goes on.

Every batch that any attempt drew is compared, token for token, with the uninterrupted run's batch of
that step and micro-batch. A resume over another number of ranks is refused in one sentence.

    data_resume_check.py --loom-run LOOM_RUN --program DIST_DATA_RESUME --ranks N --strategy S
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from resume_runs import differences  # noqa: E402

STEPS = 12


def write_documents(folder: Path) -> None:
    """40 documents of 2 to 42 characters over three JSON Lines files, so that sequences of 13 tokens
    join documents and split them, and a rank's share of an epoch (about 35 sequences at 2 ranks, 23 at
    3) runs out within a run of 48: the runs go on into the next epoch, reshuffled."""
    folder.mkdir(parents=True)
    files = [(folder / f"part-{k}.jsonl").open("w") for k in range(3)]
    for k in range(40):
        text = f"{k}:" + "".join(chr(ord("a") + (k * 7 + i) % 26) for i in range((k * 37) % 41))
        files[k % 3].write(json.dumps({"text": text, "id": k}) + "\n")
    for f in files:
        f.close()


def launch(args, data: Path, out: Path, ranks: int, *, env: dict[str, str] | None = None,
           restarts: int = 0) -> subprocess.CompletedProcess:
    command = [args.loom_run, "--nproc-per-node", str(ranks), "--max-restarts", str(restarts), "--", args.program,
               args.strategy, str(data), str(out), str(STEPS)]
    return subprocess.run(command, env={**os.environ, **(env or {})}, capture_output=True, text=True)


def batches(out: Path, ranks: int) -> dict[tuple[int, int, int], list[list[int]]]:
    """Every (rank, step, micro) drawn, with each drawing of it (an attempt killed after drawing a
    step's batch and its resumed successor both drew it)."""
    drawn: dict[tuple[int, int, int], list[list[int]]] = {}
    for rank in range(ranks):
        for line in (out / f"batches-rank-{rank}.txt").read_text().splitlines():
            step, micro, *ids = map(int, line.split())
            drawn.setdefault((rank, step, micro), []).append(ids)
    return drawn


def batch_differences(straight: Path, out: Path, ranks: int) -> list[str]:
    expected, actual = batches(straight, ranks), batches(out, ranks)
    found = [f"rank {r} step {s} micro {m} never drawn" for (r, s, m) in expected if (r, s, m) not in actual]
    for key, drawings in actual.items():
        for ids in drawings:
            if key not in expected or ids != expected[key][0]:
                found.append(f"rank {key[0]} step {key[1]} micro {key[2]}: {ids[:8]}... not the straight run's "
                             f"{expected.get(key, [[]])[0][:8]}...")
    if len(expected) != ranks * STEPS * 2:
        found.append(f"the straight run drew {len(expected)} micro-batches, not {ranks * STEPS * 2}")
    return found


def main() -> int:
    parser = argparse.ArgumentParser()
    for flag in ("--loom-run", "--program", "--strategy"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--ranks", type=int, required=True)
    args = parser.parse_args()
    failures: list[str] = []
    kill = {"LOOM_FAILPOINT": "step.optimizer", "LOOM_FAILPOINT_HIT": "8", "LOOM_FAILPOINT_RANK": "1"}
    with tempfile.TemporaryDirectory() as root:
        data = Path(root) / "data"
        write_documents(data)
        straight = Path(root) / "straight"
        run = launch(args, data, straight, args.ranks)
        if run.returncode != 0:
            print(f"FAIL: the uninterrupted run ended with {run.returncode}: {run.stdout[-2000:]}{run.stderr[-2000:]}")
            return 1

        def check(name: str, out: Path, runs: list[subprocess.CompletedProcess]) -> None:
            said = "".join(r.stdout + r.stderr for r in runs)
            if runs[-1].returncode != 0 or "(step 6)" not in said:
                failures.append(f"{name}: not resumed from step 6 and finished ({runs[-1].returncode}): {said[-2500:]}")
                return
            found = batch_differences(straight, out, args.ranks) + differences(straight, out, args.ranks)
            failures.extend(f"{name}: {line}" for line in found[:10])
            if not found:
                print(f"{args.ranks} ranks, {args.strategy}, {name}: resumed from step 6, every batch and the final "
                      "state bit for bit")

        restarted = Path(root) / "restarted"
        check("SIGKILL, loom-run --max-restarts 1", restarted,
              [launch(args, data, restarted, args.ranks, env={**kill, "LOOM_FAILPOINT_RESTART": "0"}, restarts=1)])

        relaunched = Path(root) / "relaunched"
        killed = launch(args, data, relaunched, args.ranks, env=kill)
        if killed.returncode == 0:
            failures.append("SIGKILL: the killed run ended well")
        check("SIGKILL, launched again", relaunched, [killed, launch(args, data, relaunched, args.ranks)])

        preempted = Path(root) / "preempted"
        stopped = launch(args, data, preempted, args.ranks,
                         env={"LOOM_FAILPOINT": "step.clip", "LOOM_FAILPOINT_HIT": "5", "LOOM_FAILPOINT_RANK": "1",
                              "LOOM_FAILPOINT_SIGNAL": "SIGTERM"})
        if stopped.returncode != 75 or not (preempted / "run" / "checkpoints" / "step-00000006").is_dir():
            failures.append(f"SIGTERM: not stopped after step 6 with exit 75 ({stopped.returncode}): "
                            f"{stopped.stdout[-1500:]}{stopped.stderr[-1500:]}")
        else:
            check("SIGTERM, launched again", preempted, [stopped, launch(args, data, preempted, args.ranks)])

        # The straight run's checkpoints hold the positions of its ranks, which another number cannot take.
        other = args.ranks + 1
        refused = launch(args, data, straight, other)
        expected = (f"holds the data's position of each of its {args.ranks} ranks and this run has {other}: a "
                    f"rank's position cannot be split or joined, so resume with {args.ranks} ranks")
        if refused.returncode == 0 or expected not in refused.stderr:
            failures.append(f"{other} ranks on {args.ranks} ranks' checkpoint: not refused with '{expected}' "
                            f"({refused.returncode}): {refused.stderr[-2000:]}")
        else:
            print(f"{other} ranks on the checkpoint of {args.ranks}: refused, naming both")
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

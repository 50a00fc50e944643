"""scripts/gpu-check on a machine without a GPU, each step stubbed to sleep (GPU_CHECK_STUB_S): its
order (the build, the probes, the parity runs, the real-model pairs, the toy benchmarks) with one
repetition of each pair by default, and a slow run that ends inside its deadline, with the steps that
finished recorded as each finished and the one running killed with its process group and named.

    test_gpu_check.py scripts/gpu-check
"""
import itertools
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PHASES = ["build", "probe", "parity", "pair", "bench"]
PROBED = ["fsdp()", "llama-lora-bf16-fsdp", "wan-lora-bf16-fsdp"]
REAL_WORKLOADS = ["llama-lora-bf16-fsdp", "wan-lora-bf16-fsdp"]
# The slow run: steps of 2 s against a deadline of 6 s, so the step running 5 s in is killed.
STEP_S, DEADLINE_S, WRAP_UP_S = 2, 6, 1
# Where a run whose deadline did not hold is stopped: well past its 6 s, well short of the 80 s that
# 40 steps of 2 s take.
GIVE_UP_S = 30


def run_check(script: str, out: Path, settings: dict[str, str], look_at_s: float = 0):
    """The check's exit status (None where it ran past GIVE_UP_S), its output, the seconds it took to
    exit, and its steps.tsv as it stood look_at_s seconds in."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("GPU_CHECK_")}
    env.update(settings)
    # The output goes to a file: a pipe would wait for whatever process outlived the check.
    log = out.with_suffix(".out")
    started = time.monotonic()
    with open(log, "w") as output:
        process = subprocess.Popen([script, str(out)], env=env, stdout=output, stderr=subprocess.STDOUT)
    steps_then = ""
    if look_at_s:
        time.sleep(look_at_s)
        steps_then = (out / "steps.tsv").read_text() if (out / "steps.tsv").exists() else ""
    try:
        status = process.wait(timeout=GIVE_UP_S - look_at_s)
    except subprocess.TimeoutExpired:
        status = None
        process.send_signal(signal.SIGTERM)  # the check's own way to stop: the running step with it
        process.wait()
    return status, log.read_text(), time.monotonic() - started, steps_then


def steps_of(tsv: str) -> list[list[str]]:
    """steps.tsv's rows: phase, outcome, seconds, name."""
    return [line.split("\t") for line in tsv.splitlines()]


def main() -> int:
    script = sys.argv[1]
    failures = []

    def expect(ok: bool, what: str) -> None:
        print(f"{'ok' if ok else 'FAILED'}: {what}")
        if not ok:
            failures.append(what)

    with tempfile.TemporaryDirectory() as scratch:
        # Every step at once, the deadline left at its default.
        quick = Path(scratch) / "quick"
        status, output, seconds, _ = run_check(script, quick, {"GPU_CHECK_STUB_S": "0"})
        print(output)
        rows = steps_of((quick / "steps.tsv").read_text())
        names = [row[3] for row in rows]
        expect(status == 0 and all(row[1] == "passed" for row in rows), "every stubbed step passes, exit status 0")
        expect("deadline 540 s" in output, "the deadline is 540 s by default")
        phases = [row[0] for row in rows]
        in_order = [phase for i, phase in enumerate(phases) if i == 0 or phase != phases[i - 1]]
        expect(in_order == PHASES, f"the parts of the check run in the order {PHASES}: {in_order}")
        probes = [row[3] for row in rows if row[0] == "probe" and "whole steps of loom::train" in row[3]]
        expect(len(probes) == len(PROBED) and all(w in name for w, name in zip(PROBED, probes)),
               f"the probes begin with whole loom::train steps of {PROBED}: {probes}")
        pairs = sorted(row[3] for row in rows if row[0] == "pair" and row[3].startswith("real-model pair"))
        expect(pairs == [f"real-model pair {w} (1/1)" for w in REAL_WORKLOADS],
               f"one real-model pair of each workload by default: {pairs}")
        slept = (quick / "stub-slept.txt").read_text().splitlines()
        expect(slept == names, "each stub ran, in the order steps.tsv records")

        # Steps too slow for the deadline.
        slow = Path(scratch) / "slow"
        settings = {"GPU_CHECK_STUB_S": str(STEP_S), "GPU_CHECK_DEADLINE_S": str(DEADLINE_S),
                    "GPU_CHECK_WRAP_UP_S": str(WRAP_UP_S)}
        status, output, seconds, steps_then = run_check(script, slow, settings, look_at_s=STEP_S + 1)
        print(output)
        expect(status is not None, f"the slow run ends by itself (stopped here after {GIVE_UP_S} s otherwise)")
        expect(seconds < DEADLINE_S, f"the slow run ends inside its deadline of {DEADLINE_S} s: {seconds:.2f} s")
        rows = steps_of((slow / "steps.tsv").read_text())
        outcomes = [row[1] for row in rows]
        finished = outcomes.count("passed")
        runs = [f"{len(list(group))} {outcome}" for outcome, group in itertools.groupby(outcomes)]
        expect(runs == [f"{finished} passed", "1 cut off", f"{len(rows) - finished - 1} not started"] and finished >= 1,
               f"the steps before the deadline passed, the one running was cut off, the rest never started: {runs}")
        expect([row[3] for row in rows] == names, "the slow run records every step of the quick one, in its order")
        expect(all(float(row[2]) >= STEP_S for row in rows[:finished]), "each step that passed ran its whole sleep")
        expect(steps_of(steps_then)[:1] == rows[:1],
               f"{STEP_S + 1} s in, steps.tsv already records the first step, which ended at {STEP_S} s")
        cut = rows[finished][3] if finished < len(rows) else "(none)"
        expect(status == 1 and f"cut off by the deadline ({DEADLINE_S} s): {cut}" in output,
               f"the exit status counts the step cut off, and the summary names it: status {status}")
        time.sleep(STEP_S + 0.5)  # as long as the cut step's sleep had left, and more
        slept = (slow / "stub-slept.txt").read_text().splitlines()
        expect(slept == [row[3] for row in rows[:finished]],
               "the cut step's sleeping child died with its process group: it never noted its name")

    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

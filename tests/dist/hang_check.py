#!/usr/bin/env python3
"""Hangs diagnosed in seconds (docs/reliability.md): ranks that part ways, a rank that leaves while
its peers still need it, and a rank stopped with SIGSTOP each take the job down well before
LOOM_TIMEOUT_S, with one message naming the rank, its pass and the collective; a rank that is merely
slow does not.

    hang_check.py LOOM_RUN LOOM_BENCH DEVICE_PARITY RANKS
"""
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GRACE_S = 3


def survivors(marker: str) -> list[str]:
    return subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()


def per_rank(program: list[str], short_rank: int, short: str, long: str, count_flag: str = "") -> list[str]:
    """The program with its step count chosen by RANK: `short` on `short_rank`, `long` elsewhere."""
    count = f'$( [ "$RANK" = {short_rank} ] && echo {short} || echo {long} )'
    return ["sh", "-c", f'exec "$@" {count_flag} {count}', "sh", *program]


class Checker:
    def __init__(self, loom_run: str):
        self.loom_run = loom_run
        self.failures: list[str] = []

    def run(self, case: str, ranks: str, command: list[str], env: dict, bound_s: float, expect_ok: bool = False,
            expect: list[str] = (), at_fault: str | None = None) -> str:
        start = time.monotonic()
        done = subprocess.run([self.loom_run, "--grace-s", str(GRACE_S), "--nproc-per-node", ranks, "--", *command],
                              env=env, capture_output=True, text=True, timeout=120)
        took = time.monotonic() - start
        lines = [line for line in done.stderr.splitlines() if "loom" in line]
        # c10's C++ backtraces ("frame #3: ...") appear only when TORCH_SHOW_CPP_STACKTRACES=1 asks for them.
        frames = [line for line in done.stderr.splitlines() if "frame #" in line]
        if frames and env.get("TORCH_SHOW_CPP_STACKTRACES") != "1":
            self.failures.append(f"{case}: {len(frames)} lines of a C++ backtrace reached the output, e.g. "
                                 f"'{frames[0][:200]}'")
        # Gloo's and c10d's words around a broken connection: loom's sentence is what a user reads.
        noise = [line for line in done.stderr.splitlines() if "GLHF" in line or "Exception raised from" in line]
        if noise and env.get("TORCH_SHOW_CPP_STACKTRACES") != "1":
            self.failures.append(f"{case}: {len(noise)} lines of Gloo's or c10d's noise reached the output, e.g. "
                                 f"'{noise[0][:200]}'")
        last = lines[-1] if lines else ""
        print(f"--- {case}: exit {done.returncode} in {took:.1f} s\n" + "\n".join(lines[-6:]))
        if expect_ok:
            if done.returncode != 0:
                self.failures.append(f"{case}: a slow rank was taken for a hang: exit {done.returncode}, '{last}'")
            return done.stderr
        if done.returncode != 1 or "failed first" not in last:
            self.failures.append(f"{case}: expected loom-run to report the failed rank, got exit {done.returncode}, "
                                 f"'{last}'")
        if at_fault is not None and not last.startswith(f"loom-run: rank {at_fault} failed first, as rank "):
            self.failures.append(f"{case}: loom-run's last line does not name rank {at_fault}, which the hang check "
                                 f"found at fault: '{last}'")
        if took > bound_s:
            self.failures.append(f"{case}: the job took {took:.1f} s to end, more than {bound_s} s")
        for pattern in expect:
            if not re.search(pattern, done.stderr):
                self.failures.append(f"{case}: no line matches '{pattern}'")
        return done.stderr

    def peers_quote(self, stderr: str, cause: str) -> None:
        """Every rank that reports loom's error quotes `cause`. A peer may print nothing: loom-run's SIGTERM,
        sent once the first rank fails, may end it before its own wait breaks."""
        for line in re.findall(r"\[rank \d\] loom-bench: loom: .*", stderr):
            if cause not in line:
                self.failures.append(f"a rank's error does not quote the cause '{cause}': {line[:300]}")


def main() -> int:
    loom_run, loom_bench, device_parity, ranks = sys.argv[1:5]
    world = int(ranks)
    check = Checker(loom_run)
    base = {k: v for k, v in os.environ.items() if not k.startswith("LOOM_")}
    with tempfile.TemporaryDirectory() as root:
        # The issue's own example: one rank runs 2 steps, the others 6, with every default (a 300 s
        # timeout, a 5 s hang check). The short rank waits in loom-bench's final all-gather while a
        # peer goes on into its next backward. Rank 0 hosts the store: both places are tried.
        short = 0 if world == 2 else 1
        stderr = check.run(f"loom-bench mlp-ddp, rank {short} runs 2 steps, the others 6", ranks,
                           per_rank([loom_bench, "--workload", "mlp-ddp", "--warmup", "1"], short, "2", "6",
                                    "--steps"), base, bound_s=15,
                           expect=[rf"rank {short} failed: it waited [\d.]+ s in all_gather Double\[\d+\] after pass 3, "
                                   r"but rank \d has gone on to the backward of pass 4 without joining it: the ranks "
                                   r"issue different collectives"])
        check.peers_quote(stderr, f"rank {short} failed: it waited")
        waited = [float(s) for s in re.findall(r"it waited ([\d.]+) s in all_gather", stderr)]
        if waited and max(waited) > 10:
            check.failures.append(f"the short rank waited {max(waited)} s before it stopped the job, more than 10")

        # The same under fsdp: the short rank's end of the run (loom::train's all-reduce of each rank's
        # peak memory) meets a peer's forward all-gather in the same slot. Either the hang check names
        # the two collectives, or, where Gloo sees the sizes first, it aborts on its own thread
        # (std::terminate) in about 2 s and loom's terminate handler says where the rank was; both are
        # published, so every rank's error names the cause.
        aborted = (r"rank \d failed: an error where nothing catches it ended the process \((\w+ \w+\[[\d,]+\] )?"
                   r"after pass 3\): .*Received data size doesn't match expected size")
        named = r"rank \d failed: it waited [\d.]+ s in \w+ \w+\[[\d,]+\] .*: the ranks issue different collectives"
        stderr = check.run(f"loom-bench gpt-fsdp, rank {short} runs 2 steps, the others 6", ranks,
                           per_rank([loom_bench, "--workload", "gpt-fsdp", "--warmup", "1"], short, "2", "6", "--steps"),
                           base, bound_s=15, expect=[f"({aborted}|{named})"])
        check.peers_quote(stderr, "the ranks issue different collectives" if re.search(named, stderr)
                          else "failed: an error where nothing catches it ended the process")

        # A rank whose program ends (exit 0) while its peers still need it.
        last = world - 1
        out = Path(root) / "leaves.safetensors"
        check.run(f"ddp, rank {last} ends its program after 2 steps, the others train 6", ranks,
                  per_rank([device_parity, "ddp", str(out)], last, "2", "6"), dict(base, LOOM_TIMEOUT_S="20"),
                  bound_s=15, expect=[rf"rank {last} left the job after pass 4 \(its program ended"])

        # A rank stopped (SIGSTOP) in its second backward: alive, silent. Bound: LOOM_TIMEOUT_S + 5 s.
        victim = str(world - 1) if world == 2 else "1"
        stop = dict(base, LOOM_TIMEOUT_S="20", LOOM_HANG_CHECK_S="2", LOOM_FAILPOINT="step.backward",
                    LOOM_FAILPOINT_HIT="2", LOOM_FAILPOINT_RANK=victim, LOOM_FAILPOINT_SIGNAL="SIGSTOP")
        # Where the others wait: in ddp's backward (the Reducer's), or on one of loom's collectives (fsdp's in
        # the backward, or the loop's loss average after it, when the stopped rank had issued the backward's).
        waits = {"ddp": r"the backward of pass \d+ \(schedule entr(y|ies) #\d",
                 "fsdp": r"(all_gather|reduce_scatter|all_reduce) \w+\[",
                 "lora-fsdp": r"(all_gather|reduce_scatter|all_reduce) \w+\["}
        for strategy, wait in waits.items():
            out = Path(root) / f"stopped-{strategy}.safetensors"  # unique: it marks the job's processes
            check.run(f"{strategy}, rank {victim} stopped (SIGSTOP) in its second backward", ranks,
                      [device_parity, strategy, str(out), "20"], stop, bound_s=20 + 5,
                      expect=[rf"rank \d failed: it waited [\d.]+ s in {wait}.*, but rank {victim} has sent no heartbeat "
                              r"for [\d.]+ s \(its last beat: .*\): it is stopped \(SIGSTOP"], at_fault=victim)
            if survivors(str(out)):
                check.failures.append(f"{strategy}, rank {victim} stopped: processes left behind")
        # The same with the defaults a user has, at the 10 s timeout (13 s before, with Gloo's words).
        out = Path(root) / "stopped-defaults.safetensors"
        defaults = dict(stop, LOOM_TIMEOUT_S="10", LOOM_FAILPOINT="step.forward", LOOM_FAILPOINT_HIT="1")
        del defaults["LOOM_HANG_CHECK_S"]
        check.run(f"ddp, rank {victim} stopped in its first forward, LOOM_TIMEOUT_S=10, the default hang check", ranks,
                  [device_parity, "ddp", str(out), "20"], defaults, bound_s=10 + 5,
                  expect=[rf"but rank {victim} has sent no heartbeat"], at_fault=victim)

        # Merely slow: a rank that sleeps 3 hang checks long in its backward or forward, while its peers
        # wait for it, is not a hang; the job finishes.
        for strategy, point in (("ddp", "step.backward"), ("fsdp", "step.backward"), ("lora-fsdp", "step.forward")):
            out = Path(root) / f"slow-{strategy}.safetensors"
            check.run(f"{strategy}, rank {victim} sleeps 6 s at {point}", ranks, [device_parity, strategy, str(out), "6"],
                      dict(base, LOOM_TIMEOUT_S="20", LOOM_HANG_CHECK_S="2", LOOM_FAILPOINT=point, LOOM_FAILPOINT_HIT="2",
                           LOOM_FAILPOINT_RANK=victim, LOOM_FAILPOINT_SLEEP_S="6"), bound_s=60, expect_ok=True)
    for failure in check.failures:
        print("FAIL:", failure)
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
